"""The ``train`` section: the clients' local solver."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .section import Section


class TrainConfig(Section):
    """The local solver; defaults are the FedSoft reference code's synthetic settings."""

    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = Field(5e-3, gt=0.0)
    batch_size: int | None = Field(10, ge=1, description="null: full batch (gradient descent)")
    local_epochs: int = Field(10, ge=1)
    shuffle: bool = Field(False, description="reshuffle each epoch (reference code: fixed order)")
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="sgd only")
    weight_decay: float = Field(0.0, ge=0.0)
    nan_policy: Literal["stop", "exclude"] = Field(
        "stop", description="a client update with NaN/inf values stops the run, or is excluded (and reported)"
    )
    batched_clients: Literal["auto", "on", "off"] = Field(
        "auto", description="train a host's clients in one vectorised computation (FedSoft, FedAvg, Local); "
        "auto: for the linear and logistic models, where it measured faster (docs/performance.md)"
    )
