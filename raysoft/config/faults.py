"""The ``faults`` section's entries: injected faults, for testing recovery."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .section import Section


class Fault(Section):
    """An injected fault: ``kill_actor`` kills client actor ``actor`` at the start of round
    ``at_round`` (``hang_actor`` makes it stop answering, alive, for ``factor`` seconds; Ray
    backend only); ``nan_update`` makes client ``client``'s update of that round NaN;
    ``slow_client`` makes client ``client``'s work take ``factor`` times as long from that round on."""

    kind: Literal["kill_actor", "nan_update", "slow_client", "hang_actor"]
    at_round: int = Field(ge=0)
    actor: int = Field(0, ge=0)
    client: int = Field(0, ge=0)
    factor: float = Field(1.0, ge=1.0)
