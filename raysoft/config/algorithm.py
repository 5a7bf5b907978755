"""The ``algorithm`` section's base: the keys every algorithm has. Each algorithm's own
settings subclass it, next to their code (:mod:`raysoft.algorithms.settings` for the built-ins,
docs/plugins.md for a plug-in's)."""

from __future__ import annotations

from typing import ClassVar, Protocol

from pydantic import Field

from .backend import RayConfig
from .callbacks import CallbackConfig
from .clock import ClockConfig
from .data import DataConfig
from .faults import Fault
from .model import ModelConfig
from .output import OutputConfig
from .section import PluginSection
from .train import TrainConfig


class Sections(Protocol):
    """The whole config (:class:`raysoft.config.Config`) as :meth:`AlgorithmConfig.check_with`
    reads it: its sections, validated and frozen. A protocol, so that this module need not
    import the one that puts the sections together (which imports this one)."""

    @property
    def seed(self) -> int: ...
    @property
    def algorithm(self) -> AlgorithmConfig: ...
    @property
    def data(self) -> DataConfig: ...
    @property
    def model(self) -> ModelConfig: ...
    @property
    def train(self) -> TrainConfig: ...
    @property
    def ray(self) -> RayConfig: ...
    @property
    def output(self) -> OutputConfig: ...
    @property
    def faults(self) -> list[Fault]: ...
    @property
    def clock(self) -> ClockConfig: ...
    @property
    def callbacks(self) -> list[CallbackConfig]: ...


class AlgorithmConfig(PluginSection):
    """Keys every algorithm has."""

    KIND = "algorithms"
    name: str
    rounds: int = Field(100, ge=1, description="T, the number of global rounds")
    clients_per_round: int = Field(
        60, ge=1, description="K: clients drawn per cluster (FedSoft) or per round (others)"
    )
    eval_every: int = Field(5, ge=1, description="evaluate every this many rounds")

    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ("num_centers",)  # keys whose null means "the default"

    @classmethod
    def fill_defaults(cls, given: dict[str, object], clients: object, distributions: object) -> dict[str, object]:
        """``given`` (the keys a config gives, before validation) with the defaults that depend on
        the data section filled in: ``num_centers`` = ``data.distributions`` where the settings
        have that key. A plug-in overrides this for keys of its own."""
        filled = dict(given)
        if "num_centers" in cls.model_fields and "num_centers" not in given:
            filled["num_centers"] = distributions
        return filled

    def check_with(self, cfg: Sections) -> None:
        """Checks of these settings against the other sections of ``cfg`` (the whole
        :class:`raysoft.config.Config`), after all are validated: raise ValueError with a one-line
        message. Nothing by default."""
