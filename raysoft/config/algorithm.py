"""The ``algorithm`` section's base: the keys every algorithm has. Each algorithm's own
settings subclass it, next to their code (:mod:`raysoft.algorithms.settings` for the built-ins,
docs/plugins.md for a plug-in's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from .section import Section

if TYPE_CHECKING:
    from .experiment import Config


class AlgorithmConfig(Section):
    """Keys every algorithm has."""

    name: str
    rounds: int = Field(100, ge=1, description="T, the number of global rounds")
    clients_per_round: int = Field(
        60, ge=1, description="K: clients drawn per cluster (FedSoft) or per round (others)"
    )
    eval_every: int = Field(5, ge=1, description="evaluate every this many rounds")

    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ("num_centers",)  # keys whose null means "the default"

    @classmethod
    def fill_defaults(cls, given: dict[str, Any], clients: Any, distributions: Any) -> dict[str, Any]:
        """``given`` (the keys a config gives, before validation) with the defaults that depend on
        the data section filled in: ``num_centers`` = ``data.distributions`` where the settings
        have that key. A plug-in overrides this for keys of its own."""
        filled = dict(given)
        if "num_centers" in cls.model_fields and "num_centers" not in given:
            filled["num_centers"] = distributions
        return filled

    def check_with(self, cfg: Config) -> None:
        """Checks of these settings against the other sections, after all are validated: raise
        ValueError with a one-line message. Nothing by default."""
