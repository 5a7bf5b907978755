"""The ``clock`` section: the simulated clock of synchronous rounds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .section import Section


class ClockConfig(Section):
    """The simulated clock of synchronous rounds (raysoft/runtime/clock.py): per-client speeds,
    the simulated seconds a client's training takes, and a round deadline decided in that time,
    per client, the same on every backend and packing."""

    speeds: Literal["off", "equal", "lognormal", "file"] = Field(
        "off", description="off: no simulated clock; equal: every client at speed 1; lognormal: exp(N(0, sigma^2)) "
        "per client, from the run seed; file: speeds_file"
    )
    sigma: float = Field(0.5, ge=0.0, description="speeds: lognormal: the spread of the clients' log speeds")
    speeds_file: str | None = Field(None, description="speeds: file: a CSV with the columns client,speed")
    jitter: float = Field(
        0.0, ge=0.0, description="round-to-round variation: each client's duration in each round is multiplied by "
        "exp(N(0, jitter^2)), drawn from (run seed, round, client); 0: none"
    )
    seconds_per_sample: float = Field(
        0.01, gt=0.0, description="simulated seconds one training sample of one local epoch takes at speed 1"
    )
    round_deadline_s: float | None = Field(
        None, gt=0.0, description="simulated seconds a client's training may take; the clients that would take "
        "longer are left out of the round (an event each); null: no deadline"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ClockConfig:
        if self.speeds == "file" and not self.speeds_file:
            raise ValueError("[at:speeds_file] needed with speeds: file (a CSV of client,speed)")
        if self.speeds != "file" and self.speeds_file:
            raise ValueError(f"[at:speeds_file] read only with speeds: file (speeds is {self.speeds})")
        if self.speeds == "off" and self.round_deadline_s is not None:
            raise ValueError("[at:round_deadline_s] needs speeds (equal, lognormal or file), not off")
        return self

    @property
    def on(self) -> bool:
        return self.speeds != "off"
