"""The whole experiment: the sections together, the ``algorithm``, ``data``, ``model`` and
``callbacks`` sections dispatched on their ``name`` to the settings class of the plug-in it names
(:mod:`raysoft.plugins`), the defaults one section takes from another, and the rules across
sections."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, cast

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator

from ..errors import ConfigError
from ..plugins import Plugin, lookup, register_bases, settings_class
from .algorithm import AlgorithmConfig
from .backend import RayConfig
from .callbacks import CallbackConfig
from .clock import ClockConfig
from .data import DataConfig
from .faults import Fault
from .model import ModelConfig
from .output import OutputConfig
from .section import AT_NAME, Section, at, format_error
from .train import TrainConfig

DISPATCHED = {"algorithm": ("algorithms", "fedsoft"), "data": ("datasets", "synthetic"), "model": ("models", "linear")}
"""section -> (the kind of plug-in its name names, the name when none is given)."""


M = TypeVar("M", bound=BaseModel)


def _default(section: str, base: type[M]) -> M:
    """The section's default: its default plug-in's settings (a ``base``, as registered)."""
    kind, name = DISPATCHED[section]
    return cast(M, settings_class(kind, name).model_validate({"name": name}))


def _dispatch(kind: str, v: object, default: str | None) -> BaseModel:
    """Validate a section's mapping with the settings class of the plug-in its ``name`` names."""
    if isinstance(v, Section):
        return v
    if not isinstance(v, Mapping):
        raise ValueError("must be a mapping with a 'name'")
    name = v.get("name", default)
    if name is None:
        raise ValueError("required key 'name' is missing")
    if not isinstance(name, str):
        raise ValueError(f"{AT_NAME}must be a string (got {name!r})")
    try:
        settings = lookup(kind, name).settings  # the one lookup; the section's ``plugin`` reads it
    except ConfigError as err:
        raise ValueError(f"{AT_NAME}{err}") from None
    return settings.model_validate(dict(v))


class Config(Section):
    """A whole experiment."""

    SECTIONS: ClassVar[tuple[str, ...]] = ("seed", "algorithm", "data", "model", "train", "ray", "output", "faults",
                                           "callbacks", "clock")

    seed: int = 0
    algorithm: AlgorithmConfig = Field(default_factory=lambda: _default("algorithm", AlgorithmConfig))
    data: DataConfig = Field(default_factory=lambda: _default("data", DataConfig))
    model: ModelConfig = Field(default_factory=lambda: _default("model", ModelConfig))
    train: TrainConfig = Field(default_factory=TrainConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    faults: list[Fault] = Field(default_factory=list, description="fault injection, for testing recovery")
    clock: ClockConfig = Field(default_factory=ClockConfig)
    callbacks: list[CallbackConfig] = Field(
        default_factory=list, description="called with each round's (or upload's) metric rows and at the end of "
        "the run: loggers and user hooks (docs/plugins.md); the Parquet files stay the record"
    )

    @property
    def plugins(self) -> list[Plugin]:
        """Every plug-in this config names, as looked up when it was parsed
        (:class:`raysoft.plugins.Plugin`): the algorithm, the model, the dataset, a scenario's
        pool (``data.base``) and each callback. What checks, ships and builds a run reads
        these records."""
        out = [self.algorithm.plugin, self.model.plugin, self.data.plugin]
        base = getattr(self.data, "base_plugin", None)  # a scenario's pool (data.name: scenario)
        return out + ([base] if isinstance(base, Plugin) else []) + [c.plugin for c in self.callbacks]

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, raw: object) -> object:
        """Defaults that depend on other sections, filled in the raw mapping before the
        sections are validated and frozen: the algorithm's num_centers (data.distributions),
        a stream's rounds (data.clients x cycles) and tau0 (data.clients)."""
        if not isinstance(raw, Mapping):
            return raw
        raw = dict(raw)
        algo, data = raw.get("algorithm", {}), raw.get("data", {})
        if isinstance(algo, AlgorithmConfig):
            given = {k: v for k, v in algo.model_dump().items() if k in algo.model_fields_set}
            kind: type[AlgorithmConfig] | None = type(algo)
        elif isinstance(algo, Mapping):
            given = dict(algo)
            name = given.get("name", DISPATCHED["algorithm"][1])
            try:
                found = settings_class("algorithms", name) if isinstance(name, str) else None
                kind = cast(type[AlgorithmConfig], found)
            except ConfigError:  # reported, with its key, when the section is validated
                kind = None
        else:
            return raw
        for key in kind.NULL_IS_DEFAULT if kind is not None else ():
            if key in given and given[key] is None:  # null: the default
                del given[key]
        if isinstance(data, DataConfig):
            clients, dists = data.clients, data.distributions
        elif isinstance(data, Mapping):
            fields = DataConfig.model_fields
            clients = data.get("clients", fields["clients"].default)
            dists = data.get("distributions", fields["distributions"].default)
        else:
            return raw
        if kind is None:
            return raw
        filled = kind.fill_defaults(given, clients, dists)
        raw["algorithm"] = algo.model_copy(update=filled) if isinstance(algo, AlgorithmConfig) else filled
        return raw

    @field_validator("algorithm", "data", "model", mode="before")
    @classmethod
    def _dispatch_section(cls, v: object, info: ValidationInfo) -> BaseModel:
        kind, default = DISPATCHED[str(info.field_name)]
        return _dispatch(kind, v, default)

    @field_validator("callbacks", mode="before")
    @classmethod
    def _dispatch_callbacks(cls, v: object) -> list[BaseModel]:
        if not isinstance(v, list):
            raise ValueError("must be a list of mappings, each with a 'name'")
        out = []
        for i, item in enumerate(v):
            try:
                out.append(_dispatch("callbacks", item, None))
            except ValidationError as err:  # keep the item's index in the location
                msg = format_error(err)
                key, sep, rest = msg.partition(": ")
                raise ValueError(at(f"{i}.{key}", rest) if sep else at(str(i), msg)) from None
            except ValueError as err:
                raise ValueError(at(str(i), str(err))) from None
        return out

    @model_validator(mode="after")
    def _cross_section(self) -> Config:
        algo, data = self.algorithm, self.data
        if algo.clients_per_round > data.clients:
            raise ValueError(
                f"algorithm.clients_per_round ({algo.clients_per_round}) > data.clients ({data.clients})"
            )
        for f in self.faults:
            if f.kind in ("nan_update", "slow_client") and f.client >= data.clients:
                raise ValueError(f"faults: client {f.client} does not exist (data.clients is {data.clients})")
            if f.kind == "hang_actor" and self.ray.backend != "ray":
                raise ValueError("faults: hang_actor needs ray.backend: ray (an actor that stops answering)")
        if self.train.device == "cuda" and self.ray.backend == "ray" and self.ray.num_gpus_per_actor <= 0:
            raise ValueError("train.device: cuda needs ray.num_gpus_per_actor > 0 on ray.backend: ray "
                             "(each client actor's share of a GPU)")
        if self.clock.on and getattr(type(algo), "stream", False):
            raise ValueError(f"clock: is for synchronous rounds; algorithm {algo.name} is a stream with a virtual "
                             "clock of its own (upload_rate, join_schedule)")
        algo.check_with(self)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved config, defaults included, as plain YAML-able data."""
        return self.model_dump(mode="json", serialize_as_any=True)


register_bases(algorithms=AlgorithmConfig, models=ModelConfig, datasets=DataConfig, callbacks=CallbackConfig)
