"""Typed, validated experiment configuration.

A config is YAML with the top-level sections ``seed``, ``algorithm``, ``data``, ``model``,
``train``, ``ray``, ``output``, ``faults``, ``callbacks`` and ``clock``. Every section is a
frozen pydantic model that forbids unknown keys and checks types strictly, so a typo fails
before Ray starts. The ``algorithm``, ``data``, ``model`` and ``callbacks`` sections are
dispatched on their ``name`` to the settings class of the plug-in it names
(:mod:`raysoft.plugins`; the built-ins are plug-ins too, their settings in
:mod:`raysoft.algorithms.settings` and :mod:`raysoft.catalog`), so each algorithm declares
exactly the hyper-parameters it has.

Bad input raises :class:`ConfigError` whose message is one line naming the key and the problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigError
from .plugins import register_bases, registered, settings_class


class Section(BaseModel):
    """Base of every config section: frozen, strict types, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --------------------------------------------------------------------------- algorithms
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


def _default_algorithm() -> AlgorithmConfig:
    return cast(AlgorithmConfig, settings_class("algorithms", "fedsoft").model_validate({"name": "fedsoft"}))


def _default_data() -> DataConfig:
    return cast(DataConfig, settings_class("datasets", "synthetic").model_validate({"name": "synthetic"}))


def _default_model() -> ModelConfig:
    return cast(ModelConfig, settings_class("models", "linear").model_validate({"name": "linear"}))


def _dispatch(kind: str, v: Any, default: str | None) -> Any:
    """Validate a section's mapping with the settings class of the plug-in its ``name`` names."""
    if isinstance(v, Section):
        return v
    if not isinstance(v, Mapping):
        raise ValueError("must be a mapping with a 'name'")
    name = v.get("name", default)
    if name is None:
        raise ValueError("required key 'name' is missing")
    if not isinstance(name, str):
        raise ValueError(f"{_AT_NAME}must be a string (got {name!r})")
    try:
        settings = settings_class(kind, name)
    except ConfigError as err:
        raise ValueError(f"{_AT_NAME}{err}") from None
    return settings.model_validate(dict(v))


def _at(key: str, message: str) -> str:
    """A validator's message about ``key`` inside its field: :func:`_format_error` moves the key
    into the error's location (``section.key: message``)."""
    return f"[at:{key}] {message}"


_AT_NAME = _at("name", "")


# --------------------------------------------------------------------------- other sections
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

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, raw: Any) -> Any:
        """Defaults that depend on the dataset, filled before validation (null: the default)."""
        if not isinstance(raw, Mapping):
            return raw
        raw = dict(raw)
        fpfc = raw.get("name") == "fpfc_synthetic"
        for key, default in (("partition", "clusters" if fpfc else "10:90"), ("dim", 60 if fpfc else 10),
                             ("noise_std", 0.5 if fpfc else 1.0)):
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
        if self.rotations is not None:
            if self.name == "synthetic":
                raise ValueError("rotations is for image datasets, not synthetic")
            if len(self.rotations) != self.distributions:
                raise ValueError(
                    f"rotations has {len(self.rotations)} angles but distributions is {self.distributions}"
                )
        if self.name == "emnist_letters" and self.distributions not in (1, 2, 4):
            raise ValueError(f"emnist_letters has 1, 2 or 4 distributions, got {self.distributions}")
        if self.partition in ("10:90", "30:70", "linear") and self.distributions != 2:
            raise ValueError(
                f"partition {self.partition!r} needs distributions: 2 (got {self.distributions}); "
                "use partition: random for S != 2"
            )
        return self


class ModelConfig(Section):
    """linear: regression (synthetic); logistic: multinomial LR; cnn: 2 conv + 2 FC (28x28 images,
    FedSoft's letters CNN); cifar_cnn: FedSoft's CIFAR-10 CNN; resnet18: torchvision's ResNet-18
    for 32x32 inputs (GroupNorm instead of BatchNorm)."""

    name: str = Field("linear", description="linear, logistic, cnn, cifar_cnn, resnet18, a registered model or an "
                      "import path (docs/plugins.md)")
    init: Literal["xavier_normal", "torch_default", "normal"] = "xavier_normal"
    channels: list[int] = Field(default_factory=lambda: [32, 64], description="cnn: conv channels")
    hidden: int = Field(512, ge=1, description="cnn: width of the hidden FC layer")
    memory_format: Literal["contiguous", "channels_last"] = Field(
        "contiguous", description="convolutional models: channels_last pools faster on CPU but measured "
        "no faster on W2's images (docs/performance.md); the same function, float rounding aside"
    )

    @field_validator("channels")
    @classmethod
    def _two_channels(cls, v: list[int]) -> list[int]:
        if len(v) != 2 or min(v) < 1:
            raise ValueError("must be two positive integers, e.g. [32, 64]")
        return v


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


class RayConfig(Section):
    """Execution backend and resources."""

    backend: Literal["ray", "inprocess"] = "ray"
    clients_per_actor: int | Literal["auto"] = Field(
        "auto", description="clients hosted per actor; auto: one actor per CPU (or GPU share)"
    )
    num_cpus_per_actor: float = Field(1.0, gt=0.0)
    num_gpus_per_actor: float = Field(0.0, ge=0.0, le=1.0)
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a local Ray started by raysoft")
    address: str | None = Field(None, description="join an existing cluster (host:port, auto, ray://, http://)")
    join_timeout_s: float = Field(
        30.0, gt=0.0, description="seconds to wait for the cluster at address (or RAY_ADDRESS) to answer before "
        "refusing the run (one line, exit 2)"
    )
    placement: Literal["spread", "pack", "none", "trial"] = Field(
        "spread", description="place client actors with a placement group (SPREAD over nodes, or PACK); none: Ray's "
        "default; trial: in the bundles reserved by the Ray Tune trial that runs the experiment (raysoft sweep)"
    )
    placement_timeout_s: float = Field(
        300.0, gt=0.0, description="seconds to wait for the client actors' resources on a cluster that may "
        "still grow (or is busy) before refusing the run; a plan the cluster can never hold is refused at once"
    )
    round_deadline_s: float | None = Field(
        None, gt=0.0, description="wall-clock seconds a client's training may take on its actor; a client that "
        "takes longer is left out of the round (its update unused, an event; results then depend on timing; "
        "clock: decides it in simulated time instead, reproducibly)"
    )
    call_timeout_s: float | None = Field(
        None, gt=0.0, description="seconds a wait on an actor that is alive but does not answer (hung) may last "
        "before the actor is killed and handled as a dead one; null: 10 x the longest such wait so far, at least "
        "300 s (3600 s before the first)"
    )
    deadline_grace_s: float = Field(
        30.0, gt=0.0, description="round_deadline_s: an actor that has not answered after round_deadline_s x its "
        "clients in the call + this grace is left behind as a whole (its clients late)"
    )
    client_state: Literal["memory", "disk"] = Field(
        "memory", description="where a host keeps its clients' states between their calls: resident, or as files "
        "in a scratch directory on its node, loaded only while a call uses them (bounded memory for large N)"
    )
    state_dir: str | None = Field(None, description="client_state: disk: the node-local scratch folder (default: "
                                  "the system's temporary folder)")
    balance: Literal["cost", "clients"] = Field(
        "cost", description="who trains a round's clients: cost: the client actors take runs of consecutive client "
        "ids of even cost (samples), a client trained away from its actor travelling there with its state and back; "
        "clients: each client on the actor that hosts it. The same numbers either way (off with round_deadline_s)"
    )
    reduce_in_actors: bool = Field(
        True, description="weighted sums of client updates (FedAvg, FedSoft, IFCA, FedEM) are made inside the "
        "client actors, in client-id order along the chain of actors, one tensor per actor to the "
        "coordinator; false: every update travels to the coordinator. The same numbers either way"
    )

    sum_shape: Literal["chain", "tree"] = Field(
        "chain", description="how a round's weighted sum is added up: chain: client after client, in id order "
        "(in the actors, one hop per actor); tree: runs of sum_group consecutive clients summed from zeros, "
        "then the runs' sums pairwise, then added to the start (log-depth in the actors). Either shape gives the "
        "same numbers on every backend and packing; the two shapes differ from each other in the last bits"
    )
    sum_group: int = Field(8, ge=1, description="sum_shape: tree: clients per run of the tree's first level")

    @property
    def tree_group(self) -> int | None:
        """``Plan.apply``'s ``group``: the tree's run length with ``sum_shape: tree``, None for the chain."""
        return self.sum_group if self.sum_shape == "tree" else None

    @model_validator(mode="after")
    def _deadline_needs_ray(self) -> RayConfig:
        if self.round_deadline_s is not None and self.backend != "ray":
            raise ValueError("round_deadline_s needs backend: ray")
        return self

    @field_validator("clients_per_actor")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be a positive integer or 'auto'")
        return v


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be one component of a path inside the output folder, or None."""
    if "/" in name or "\\" in name or "\0" in name:
        return f"must be one file name, not a path (got {name!r})"
    if name in (".", ".."):
        return f"must name a folder inside output.dir (got {name!r})"
    if name.startswith("."):
        return f"must not start with '.' (hidden names are the unfinished runs') (got {name!r})"
    return None


class OutputConfig(Section):
    dir: str = "runs"
    name: str | None = Field(
        None, description="run name prefix: one file name (no separators, not hidden); default <algorithm>-<data>"
    )
    progress: Literal["auto", "bar", "lines", "none"] = "auto"
    checkpoint_every: int = Field(
        0, ge=0, description="save a checkpoint (and the results so far) every this many rounds; 0: never"
    )

    @field_validator("name")
    @classmethod
    def _one_component(cls, v: str | None) -> str | None:
        why = name_problem(v) if v else None  # empty: the default
        if why is not None:
            raise ValueError(why)
        return v


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


class CallbackConfig(Section):
    """One entry of the ``callbacks`` list: a callback's ``name`` (built-in, registered or an
    import path) and the keys of its own settings."""

    name: str


class Config(Section):
    """A whole experiment."""

    SECTIONS: ClassVar[tuple[str, ...]] = ("seed", "algorithm", "data", "model", "train", "ray", "output", "faults",
                                           "callbacks", "clock")

    seed: int = 0
    algorithm: AlgorithmConfig = Field(default_factory=_default_algorithm)
    data: DataConfig = Field(default_factory=_default_data)
    model: ModelConfig = Field(default_factory=_default_model)
    train: TrainConfig = Field(default_factory=TrainConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    faults: list[Fault] = Field(default_factory=list, description="fault injection, for testing recovery")
    clock: ClockConfig = Field(default_factory=ClockConfig)
    callbacks: list[CallbackConfig] = Field(
        default_factory=list, description="called with each round's (or upload's) metric rows and at the end of "
        "the run: loggers and user hooks (docs/plugins.md); the Parquet files stay the record"
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, raw: Any) -> Any:
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
            name = given.get("name", "fedsoft")
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

    @field_validator("algorithm", mode="before")
    @classmethod
    def _dispatch_algorithm(cls, v: Any) -> Any:
        return _dispatch("algorithms", v, "fedsoft")

    @field_validator("data", mode="before")
    @classmethod
    def _dispatch_data(cls, v: Any) -> Any:
        return _dispatch("datasets", v, "synthetic")

    @field_validator("model", mode="before")
    @classmethod
    def _dispatch_model(cls, v: Any) -> Any:
        return _dispatch("models", v, "linear")

    @field_validator("callbacks", mode="before")
    @classmethod
    def _dispatch_callbacks(cls, v: Any) -> Any:
        if not isinstance(v, list):
            raise ValueError("must be a list of mappings, each with a 'name'")
        out = []
        for i, item in enumerate(v):
            try:
                out.append(_dispatch("callbacks", item, None))
            except ValidationError as err:  # keep the item's index in the location
                msg = _format_error(err)
                key, sep, rest = msg.partition(": ")
                raise ValueError(_at(f"{i}.{key}", rest) if sep else _at(str(i), msg)) from None
            except ValueError as err:
                raise ValueError(_at(str(i), str(err))) from None
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
        if self.clock.on and getattr(type(algo), "stream", False):
            raise ValueError(f"clock: is for synchronous rounds; algorithm {algo.name} is a stream with a virtual "
                             "clock of its own (upload_rate, join_schedule)")
        algo.check_with(self)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved config, defaults included, as plain YAML-able data."""
        return self.model_dump(mode="json", serialize_as_any=True)


register_bases(algorithms=AlgorithmConfig, models=ModelConfig, datasets=DataConfig, callbacks=CallbackConfig)


# --------------------------------------------------------------------------- loading
def _format_error(err: ValidationError) -> str:
    e = err.errors()[0]
    # pydantic puts the dispatched model's name into the location; drop non-key parts
    loc = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and p[:1].isupper()))
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        msg = "unknown key"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
        if msg.startswith("[at:") and "] " in msg:
            key, msg = msg[len("[at:"):].split("] ", 1)
            if msg.startswith("[at:") and "] " in msg:  # an item's own key
                inner, msg = msg[len("[at:"):].split("] ", 1)
                key = f"{key}.{inner}"
            loc = f"{loc}.{key}" if loc else key
    elif e["type"] == "missing":
        msg = "required key is missing"
    if e["type"] not in ("extra_forbidden", "missing", "value_error") and "input" in e:
        msg = f"{msg} (got {e['input']!r})"
    return f"{loc}: {msg}" if loc else msg


REGIME_SECTIONS = ("algorithm", "train", "model")
COMPARE_DEFAULT = ("fedsoft", "ifca", "fedem", "fedavg", "local")  # raysoft compare's algorithms by default


def apply_regime(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` without its ``regimes`` key, and with the regime of its own algorithm merged into
    its sections. ``regimes`` maps an algorithm name to the ``algorithm``, ``train`` and ``model``
    keys that algorithm runs with (its own reference code's optimiser, say), so that one job file
    runs every method of a comparison in its own regime on the same data; a regime's keys win over
    the sections' (and over ``--set``). The resolved config records the merged sections only."""
    out = dict(raw)
    regimes = out.pop("regimes", None)
    if regimes is None:
        return out
    if not isinstance(regimes, Mapping):
        raise ConfigError("regimes: must be a mapping of algorithm name -> sections")
    for name, regime in regimes.items():
        try:
            settings_class("algorithms", name)
        except ConfigError as err:
            raise ConfigError(f"regimes.{name}: {err}") from None
        if not isinstance(regime, Mapping):
            raise ConfigError(f"regimes.{name}: must be a mapping of sections")
        for section, keys in regime.items():
            if section not in REGIME_SECTIONS:
                raise ConfigError(f"regimes.{name}.{section}: a regime sets only {', '.join(REGIME_SECTIONS)} keys "
                                  "(the data, seed and resources stay the comparison's)")
            if not isinstance(keys, Mapping) or "name" in keys:
                raise ConfigError(f"regimes.{name}.{section}: must be a mapping of keys (without 'name')")
    algo = out.get("algorithm", {})
    name = (
        getattr(algo, "name", None) if isinstance(algo, Section)
        else algo.get("name", "fedsoft") if isinstance(algo, Mapping) else None
    )
    for section, keys in (regimes.get(name) or {}).items():
        current = out.get(section, {})
        if isinstance(current, Section):
            current = current.model_dump()
        if not isinstance(current, Mapping):
            raise ConfigError(f"{section}: must be a mapping")
        out[section] = {**current, **keys}
    return out


def parse_config(raw: Mapping[str, Any] | None) -> Config:
    """Validate a config mapping (after :func:`apply_regime`); raise :class:`ConfigError` with a
    one-line message."""
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ConfigError("config: the top level must be a mapping of sections")
    raw = apply_regime(raw)
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_error(err).replace("\n", " ") + _other_algorithms_hint(err)) from None


def _algorithm_keys(name: str) -> set[str]:
    try:
        return set(settings_class("algorithms", name).model_fields)
    except (ConfigError, ValueError):  # a plug-in that cannot be read says so when it is named
        return set()


def _other_algorithms_hint(err: ValidationError) -> str:
    """For an unknown key of the algorithm section that other built-in algorithms have: say
    which, since a config holding several algorithms' keys is meant for ``raysoft compare``."""
    e = err.errors()[0]
    keys = [p for p in e["loc"] if isinstance(p, str) and not p[:1].isupper()]
    if e["type"] != "extra_forbidden" or len(keys) != 2 or keys[0] != "algorithm":
        return ""
    owners = [name for name in sorted(registered("algorithms")) if keys[1] in _algorithm_keys(name)]
    if not owners:
        return ""
    return (f" ({keys[1]} is a key of {', '.join(owners)}: a config with several algorithms' keys is for "
            "raysoft compare CONFIG --algorithms ...)")


def apply_overrides(raw: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides (value parsed as YAML) to a raw config mapping."""
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in raw.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            raise ConfigError(f"--set {key}: cannot parse value {text!r}") from None
        parts = key.split(".")
        if parts[0] not in (*Config.SECTIONS, "regimes"):
            raise ConfigError(f"{parts[0]}: unknown section (known: {', '.join(Config.SECTIONS)}, regimes)")
        if len(parts) == 1:
            out[key] = value
            continue
        if len(parts) != 2:
            raise ConfigError(f"--set {key}: expected section.key=value")
        section = out.setdefault(parts[0], {})
        if not isinstance(section, dict):
            raise ConfigError(f"{parts[0]}: must be a mapping")
        section[parts[1]] = value
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or start from defaults), apply overrides and validate it."""
    return parse_config(load_raw(path, overrides))


def load_raw(path: str | Path | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read a YAML config and apply overrides, without validating it."""
    raw: Any = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} not found")
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ConfigError(f"config file {str(p)!r}: invalid YAML{where}") from None
        if not isinstance(raw, Mapping):
            raise ConfigError(f"config file {str(p)!r}: the top level must be a mapping of sections")
    return apply_overrides(raw, list(overrides or []))
