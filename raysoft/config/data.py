"""The ``data`` section's base: which clients exist and what data each holds, the keys the
engine reads of every dataset. A dataset's own settings subclass it with its own keys, defaults,
partitions and rules (:mod:`raysoft.catalog` for the built-ins, docs/plugins.md for a plug-in's)."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .section import PluginSection

BuiltinPartition = Literal["10:90", "30:70", "linear", "random", "clusters"]
"""``partition``'s annotation in the built-in datasets' settings."""

PARTITIONS: tuple[str, ...] = typing.get_args(BuiltinPartition)
"""The partitions the engine draws the clients' mixtures from (``raysoft.data.partition``)."""

PARTITION_HELP = ("how the clients' true mixtures are drawn: 10:90, 30:70, linear (these three need S = 2), "
                  "random or clusters (client i wholly in distribution i*S//N)")
"""``partition``'s description, in the base and in the built-in datasets' settings."""

TWO_DISTRIBUTIONS = ("10:90", "30:70", "linear")
"""The partitions that need exactly two distributions."""


def _choices(values: tuple[str, ...]) -> str:
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


class DataConfig(PluginSection):
    """Which clients exist and what data each holds (built inside the client actors). ``name``:
    a built-in dataset (synthetic, fpfc_synthetic, fmnist, emnist_letters, cifar10, cifar100), a
    registered one or an import path (docs/plugins.md)."""

    KIND = "datasets"
    name: str = "synthetic"
    clients: int = Field(100, ge=1, description="N")
    distributions: int = Field(2, ge=1, description="S, the number of cluster distributions")
    partition: str = Field(
        "10:90", description=f"{PARTITION_HELP}; a dataset may have partitions of its own"
    )
    samples_min: int = Field(100, ge=1)
    samples_max: int = Field(200, ge=1)
    test_samples: int = Field(1000, ge=1, description="holdout samples per distribution")
    seed: int | None = Field(
        None, description="the seed that alone draws the data (partition, samples, holdouts, stream cycles); "
        "null: the run's seed. Fix it and vary the run's seed for training draws on one dataset"
    )
    join_schedule: list[float] | None = Field(
        None, description="streams: the virtual time at which each client joins (cold start); default all at 0"
    )
    held_out: float = Field(
        0, ge=0, description="clients kept out of training and cold-started at evaluation: a share in [0, 1) of "
        "the clients (at least one when positive) or a whole count >= 1; drawn from data.seed (docs/running.md)"
    )
    held_out_eval: Literal["final", "every"] = Field(
        "final", description="when the held-out clients are cold-started and scored: at the final evaluation "
        "only, or at every evaluation"
    )

    PARTITIONS: ClassVar[tuple[str, ...] | None] = PARTITIONS
    """The values ``partition`` takes where it is annotated ``str`` (the engine's own; None: any
    string, which the dataset's ``client_mixtures`` then reads). A dataset with partitions of its
    own annotates ``partition`` with their ``Literal`` instead."""

    @classmethod
    def partitions(cls) -> tuple[str, ...] | None:
        """The values ``partition`` takes: its ``Literal``'s, else :attr:`PARTITIONS`."""
        annotation = cls.model_fields["partition"].annotation
        if typing.get_origin(annotation) is Literal:
            return tuple(str(v) for v in typing.get_args(annotation))
        return cls.PARTITIONS

    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ("partition",)
    """Keys whose ``null`` in a config means the dataset's default."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, raw: object) -> object:
        if not isinstance(raw, Mapping):
            return raw
        return {k: v for k, v in raw.items() if not (v is None and k in cls.NULL_IS_DEFAULT)}

    def held_out_count(self) -> int:
        """How many clients ``held_out`` keeps out of training: a share s in (0, 1) holds out
        max(1, round(s * clients)), a number >= 1 that many, 0 none."""
        if self.held_out >= 1:
            return int(self.held_out)
        return max(1, round(self.held_out * self.clients)) if self.held_out > 0 else 0

    def draw_seed(self, run_seed: int) -> int:
        """The seed the data is drawn from: ``seed`` (data.seed) if set, else the run's."""
        return run_seed if self.seed is None else self.seed

    @field_validator("partition", mode="before")
    @classmethod
    def _partition_is_text(cls, v: object) -> object:
        if isinstance(v, int) and not isinstance(v, bool):
            known = cls.partitions()
            hint = f" (one of {', '.join(known)})" if known else ""
            raise ValueError(f"got the number {v}; quote it, e.g. '10:90'{hint}")
        return v

    @field_validator("partition")
    @classmethod
    def _known_partition(cls, v: str) -> str:
        known = cls.partitions()
        if known is not None and v not in known:  # a Literal has refused it already, in the same words
            raise ValueError(f"Input should be {_choices(known)} (got {v!r})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> DataConfig:
        if self.samples_min > self.samples_max:
            raise ValueError(f"samples_min ({self.samples_min}) > samples_max ({self.samples_max})")
        if self.partition in TWO_DISTRIBUTIONS and self.distributions != 2:
            raise ValueError(
                f"partition {self.partition!r} needs distributions: 2 (got {self.distributions}); "
                "use partition: random for S != 2"
            )
        if self.held_out >= 1 and not float(self.held_out).is_integer():
            raise ValueError(f"held_out {self.held_out:g} is neither a share in [0, 1) nor a whole count of clients")
        if self.held_out_count() >= self.clients:
            raise ValueError(f"held_out {self.held_out:g} leaves no client to train (clients: {self.clients})")
        return self
