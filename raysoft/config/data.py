"""The ``data`` section's base: which clients exist and what data each holds. A dataset's own
settings subclass it (:mod:`raysoft.catalog` for the built-ins) with their defaults and rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .section import Section

PARTITIONS = ("10:90", "30:70", "linear", "random", "clusters")


class DataConfig(Section):
    """Which clients exist and what data each holds (built inside the client actors). ``name``:
    a built-in dataset (synthetic, fpfc_synthetic, fmnist, emnist_letters, cifar10, cifar100), a
    registered one or an import path (docs/plugins.md)."""

    name: str = "synthetic"
    clients: int = Field(100, ge=1, description="N")
    distributions: int = Field(2, ge=1, description="S, the number of cluster distributions")
    partition: Literal["10:90", "30:70", "linear", "random", "clusters"] = Field(
        "10:90", description="default 10:90 (fpfc_synthetic: clusters, client i wholly in distribution "
        "i*S//N)"
    )
    samples_min: int = Field(100, ge=1)
    samples_max: int = Field(200, ge=1)
    test_samples: int = Field(1000, ge=1, description="holdout samples per distribution")
    dim: int = Field(10, ge=1, description="synthetic input dimension; default 10 (fpfc_synthetic 60)")
    classes: int = Field(10, ge=2, description="fpfc_synthetic: number of classes")
    theta_std: float = Field(
        10.0, gt=0.0, description="synthetic: sigma_0 of theta_s (paper 10; reference code sqrt(10))"
    )
    noise_std: float = Field(
        1.0, ge=0.0, description="synthetic: std of epsilon (default 1); fpfc_synthetic: std of the "
        "logit noise (default 0.5)"
    )
    generator: Literal["fpfc", "fedprox"] = Field(
        "fpfc", description="fpfc_synthetic: the FPFC code's per-cluster generator, or FedProx's "
        "synthetic(alpha, beta) with its model prior drawn per cluster"
    )
    alpha: float = Field(1.0, ge=0.0, description="fpfc_synthetic/fedprox: model heterogeneity")
    beta: float = Field(1.0, ge=0.0, description="fpfc_synthetic/fedprox: feature heterogeneity")
    seed: int | None = Field(
        None, description="the seed that alone draws the data (partition, samples, holdouts, stream cycles); "
        "null: the run's seed. Fix it and vary the run's seed for training draws on one dataset"
    )
    root: str | None = Field(
        None, description="image datasets: folder of the files; default $RAYSOFT_DATA, else "
        "/usr/share/datasets/fashion-mnist for fmnist"
    )
    join_schedule: list[float] | None = Field(
        None, description="streams: the virtual time at which each client joins (cold start); default all at 0"
    )
    rotations: list[float] | None = Field(
        None, description="image datasets: rotation (degrees) of each distribution; default i*360/S "
        "(emnist_letters: lower/upper at 0, then both at 90)"
    )

    DEFAULTS: ClassVar[dict[str, Any]] = {"partition": "10:90", "dim": 10, "noise_std": 1.0}
    """Defaults a dataset's settings class may change (``null`` in a config also means these)."""

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, raw: Any) -> Any:
        """The dataset's defaults of ``DEFAULTS``, filled before validation (null: the default)."""
        if not isinstance(raw, Mapping):
            return raw
        raw = dict(raw)
        for key, default in cls.DEFAULTS.items():
            if raw.get(key) is None:
                raw[key] = default
        return raw

    def draw_seed(self, run_seed: int) -> int:
        """The seed the data is drawn from: ``seed`` (data.seed) if set, else the run's."""
        return run_seed if self.seed is None else self.seed

    @field_validator("partition", mode="before")
    @classmethod
    def _partition_is_text(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            raise ValueError(f"got the number {v}; quote it, e.g. '10:90' (one of {', '.join(PARTITIONS)})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> DataConfig:
        if self.samples_min > self.samples_max:
            raise ValueError(f"samples_min ({self.samples_min}) > samples_max ({self.samples_max})")
        if self.rotations is not None and len(self.rotations) != self.distributions:
            raise ValueError(f"rotations has {len(self.rotations)} angles but distributions is {self.distributions}")
        if self.partition in ("10:90", "30:70", "linear") and self.distributions != 2:
            raise ValueError(
                f"partition {self.partition!r} needs distributions: 2 (got {self.distributions}); "
                "use partition: random for S != 2"
            )
        return self
