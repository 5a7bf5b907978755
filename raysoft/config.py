"""Typed, validated experiment configuration.

A config is YAML with the top-level sections ``seed``, ``algorithm``, ``data``, ``model``,
``train``, ``ray`` and ``output``. Every section is a frozen pydantic model that forbids
unknown keys and checks types strictly, so a typo fails before Ray starts. The
``algorithm`` section is dispatched on its ``name`` to the algorithm's own model
(:data:`ALGORITHM_CONFIGS`), so each algorithm declares exactly the hyper-parameters it has.

Bad input raises :class:`ConfigError` whose message is one line naming the key and the problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A bad config or command-line argument; the message is one line naming the key."""


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


class FedSoftConfig(AlgorithmConfig):
    """FedSoft (Ruan & Joe-Wong, AAAI'22), Algorithm 1; defaults from the paper/reference code."""

    name: Literal["fedsoft"] = "fedsoft"
    estimation_interval: int = Field(2, ge=1, description="tau: rounds between importance estimations")
    sigma: float = Field(1e-4, ge=0.0, le=1.0, description="counter smoother: floor of u_ks")
    prox_weight: float = Field(1.0, ge=0.0, description="lambda of the proximal objective (4)")
    num_centers: int = Field(2, ge=1, description="S of the algorithm; default data.distributions")
    start: Literal["local", "mixture"] = Field(
        "local", description="where a selected client's local solve of (4) starts: local, its own persisting "
        "model w_k (the reference code); mixture, sum_s u_ks c_s of the centers it downloaded (Algorithm 1's "
        "'download {c_s}' read as a restart)"
    )
    selection: Literal["sample", "full"] = Field(
        "sample",
        description="sample: K clients per cluster drawn with prob. v_sk, c_s = 1/K average; "
        "full: every client trains, c_s = sum_k v_sk w_k",
    )


class IFCAConfig(AlgorithmConfig):
    """IFCA (Ghosh et al., NeurIPS'20): each selected client joins its lowest-loss center."""

    name: Literal["ifca"] = "ifca"
    num_centers: int = Field(2, ge=1, description="k; default data.distributions")
    option: Literal["model", "gradient", "fpfc_code"] = Field(
        "model", description="model: option II, local training + per-cluster model averaging; "
        "gradient: option I, one full-batch gradient, theta_j -= lr/m sum of members' gradients; "
        "fpfc_code: the FPFC reference code's IFCA baseline, option I whose models are averaged over all "
        "m selected clients: theta_j <- (n_j/m) theta_j - lr/m sum of members' gradients (a center "
        "shrinks each round; an empty one becomes 0)",
    )
    init_threshold: float = Field(
        0.0, ge=0.0, le=1.0,
        description="re-draw the initial centers until every center is the lowest-loss one for at "
        "least this fraction of the clients (the reference CIFAR code's find_good_initializer: 0.35 "
        "for k = 2, 0.1 for k = 4); 0 keeps the first draw",
    )
    init_attempts: int = Field(50, ge=1, description="draws tried before keeping the best one")


class FedAvgConfig(AlgorithmConfig):
    """FedAvg: one global model, n_k-weighted average of the selected clients' models."""

    name: Literal["fedavg"] = "fedavg"


class LocalConfig(AlgorithmConfig):
    """Local: every selected client trains its own model; no communication."""

    name: Literal["local"] = "local"


class FedEMConfig(AlgorithmConfig):
    """FedEM (Marfoq et al., NeurIPS'21): M shared learners, per-client mixture weights pi."""

    name: Literal["fedem"] = "fedem"
    num_centers: int = Field(2, ge=1, description="M learners; default data.distributions")
    lr_milestones: list[int] = Field(
        default_factory=list,
        description="multiply the lr by lr_decay after this many of the client's own rounds "
        "(the reference code steps its scheduler once per round the client is sampled)",
    )
    lr_decay: float = Field(0.1, gt=0.0, le=1.0)


class FPFCConfig(AlgorithmConfig):
    """FPFC (Yu et al., AAAI'23): fusion-penalized federated clustering; defaults are the
    reference code's synthetic settings (docs/algorithms.md#fpfc-defaults)."""

    name: Literal["fpfc", "fpfc_l1"] = "fpfc"
    rounds: int = Field(2000, ge=1)
    clients_per_round: int = Field(30, ge=1, description="|A_k| (reference: ratio 0.3 of m = 100)")
    eval_every: int = Field(100, ge=1)
    a: float = Field(3.7, gt=1.0, description="SCAD shape a")
    lam: float = Field(0.6, gt=0.0, description="lambda of the fusion penalty")
    xi: float = Field(1e-3, gt=0.0, description="xi of the smooth surrogate (< lambda)")
    rho: float = Field(1.0, gt=0.0, description="ADMM penalty rho")
    nu: float = Field(0.1, ge=0.0, description="devices i, j share a cluster if ||theta_ij|| <= nu")
    grouping: Literal["components", "neighbourhoods"] = Field(
        "components", description="the final clustering: components, the connected components of ||theta_ij|| <= nu "
        "(a partition); neighbourhoods, the reference code's step: each device's set of devices with "
        "||theta_ij|| < nu, the distinct sets in turn averaging their members' models (the per-round "
        "num_clusters counts the components under either grouping; the last round's follows this key)"
    )
    pairs: Literal["paper", "code"] = Field(
        "paper", description="paper: pairs i < j inside A_k, once each; code: every pair (i in A_k, "
        "j in [m]), pairs inside A_k twice, as the reference code"
    )
    report_thresholds: list[float] = Field(
        default_factory=list, description="after the last round, also count the clusters the final theta gives at "
        "each of these thresholds (diagnostics.parquet: clusters_nu=<value>); the run itself uses nu"
    )

    @model_validator(mode="after")
    def _xi_below_lambda(self) -> "FPFCConfig":
        if self.xi >= self.lam:
            raise ValueError(f"xi ({self.xi}) must be < lam ({self.lam})")
        if self.name == "fpfc" and self.rho * (self.a - 1) <= 1:
            raise ValueError(f"rho * (a - 1) must exceed 1 for the SCAD prox (got {self.rho * (self.a - 1):g})")
        return self


class CCFLConfig(AlgorithmConfig):
    """CCFL, its FedSoft-Async baseline and Local (``local_stream``: no server, each client
    keeps training its own model on its drifting data): an asynchronous stream of uploads.
    ``rounds`` is the number of uploads (global epochs T; default clients x cycles), ``eval_every``
    the uploads between cluster evaluations. Defaults: the CCFL paper's FashionMNIST (4 clusters)
    row of Table 2 and section 5.1; :func:`raysoft.algorithms.ccfl.table2_settings` gives the
    other rows. The choices where the paper is ambiguous are documented in docs/algorithms.md."""

    name: Literal["ccfl", "fedsoft_async", "local_stream"] = "ccfl"
    rounds: int = Field(2000, ge=1, description="uploads T; default data.clients x cycles")
    cycles: int = Field(25, ge=1, description="average upload-download cycles per client (FMNIST: 25)")
    clients_per_round: int = Field(1, ge=1, description="unused: clients upload when their clock says")
    eval_every: int = Field(100, ge=1, description="uploads between cluster evaluations")
    mode: Literal["virtual", "realtime"] = Field(
        "virtual", description="virtual: uploads applied in virtual-time order (reproducible); "
        "realtime: in arrival order"
    )
    c1: float = Field(0.5, ge=0.0, le=1.0)
    c2: float = Field(0.25, ge=0.0, le=1.0)
    amplifier: list[float] = Field(default_factory=lambda: [7.0], description="A, applied once per value")
    l_bar: float | Literal["min"] = 8.0
    d1_bar: float | Literal["min"] = 0.0
    d2_bar: float | Literal["min"] = 0.0
    score_floor: float | None = Field(0.0, description="clamp after the bars (docs/algorithms.md); null: none")
    loss_reduction: Literal["batch_sum", "mean", "paper_scale"] = Field(
        "batch_sum", description="scale of F(w; D_k): sum of batch-mean losses (batches of loss_batch_size), the "
        "mean, or paper_scale: the mean x ceil(2000 / loss_batch_size), the batch sum of the paper's 2000-image "
        "D_k (for smaller D_k with its bars)"
    )
    loss_batch_size: int = Field(128, ge=1, description="batch size of loss_reduction batch_sum (the paper's)")
    estimate_on: Literal["actors", "coordinator"] = Field(
        "actors", description="CCFL: where F(w_m; D_k), the uploaded model on every cluster's validation set, is "
        "computed: on the uploading client's actor, in parallel with the other clients (the server then only "
        "recomputes the cluster models it changed), or on the coordinator, upload after upload"
    )
    alpha0: float = Field(0.025, gt=0.0, le=1.0)
    alpha1_bar: float | Literal["ave"] = "ave"
    a: float = Field(10.0, ge=0.0)
    b: float = Field(5.0, ge=0.0)
    tau0: int = Field(80, ge=0, description="staleness bound: t - tau > tau0 is stale; default data.clients")
    adjust_start: float | None = Field(0.5, ge=0.0, le=1.0, description="null: no global adjustment")
    adjust_percentile: float = Field(70.0, ge=0.0, le=100.0)
    rho: float = Field(0.1, ge=0.0, description="weight of the client's proximal term (rho/2)||w - wbar||^2")
    local_epochs: int | None = Field(
        None, ge=1, description="H, the local epochs of a client's cycle on objective (2); null: train.local_epochs"
    )
    client_starts_from_reply: bool = Field(
        True, description="a client trains from the reply it received (also its prox anchor); false: from its "
        "own last local model"
    )
    sigma: float = Field(1e-4, ge=0.0, le=1.0, description="fedsoft_async: floor of the clients' mixture estimates")
    public_samples: int = Field(2000, ge=1, description="server's public images per cluster (pre-training, D_k)")
    pretrain_epochs: int = Field(5, ge=0, description="epochs of pre-training each cluster model [GUESS]")
    shared_init: bool = Field(
        True, description="every cluster model starts from the same random initialisation before pre-training "
        "(so that the initial reply, their average, is a working model) [GUESS]; false: one per cluster"
    )
    upload_rate: list[float] = Field(
        default_factory=lambda: [0.5, 2.0],
        description="each client's upload clock: exponential gaps with a rate drawn from U[min, max]",
    )
    drift: bool = Field(True, description="fresh data after every cycle; false: the first dataset stays")
    rest_split: Literal["dirichlet", "uniform", "some"] = Field(
        "dirichlet", description="how a client's non-main share is split over the other clusters: Dirichlet(1) over "
        "all of them, equally, or Dirichlet(1) over a random non-empty subset of them (the others get 0)"
    )
    validation: Literal["shared", "disjoint"] = Field(
        "shared", description="the server's validation sets D_k: its pre-training images (shared), or as many "
        "other images of the cluster (disjoint), so that F(w_k; D_k) is not a training loss"
    )
    upload_policy: Literal["clock", "shift"] = Field(
        "clock", description="clock: upload at every tick of the client's clock; shift: at a tick, upload only "
        "if the data's mixture moved by >= shift_threshold (total variation) since the last upload, else "
        "keep training on the new data"
    )
    shift_threshold: float = Field(0.25, gt=0.0, le=1.0, description="upload_policy shift: total-variation threshold")
    max_silent_ticks: int = Field(4, ge=0, description="upload_policy shift: upload anyway after this many silent ticks")

    @model_validator(mode="after")
    def _ccfl_checks(self) -> "CCFLConfig":
        if self.c1 + self.c2 > 1:
            raise ValueError(f"c1 + c2 must be <= 1 (got {self.c1 + self.c2:g})")
        if not self.amplifier or min(self.amplifier) <= 0:
            raise ValueError("amplifier must list positive values")
        if len(self.upload_rate) != 2 or not 0 < self.upload_rate[0] <= self.upload_rate[1]:
            raise ValueError("upload_rate must be [min, max] with 0 < min <= max")
        return self


ALGORITHM_CONFIGS: dict[str, type[AlgorithmConfig]] = {
    "ccfl": CCFLConfig, "fedsoft_async": CCFLConfig, "local_stream": CCFLConfig,
    "fpfc": FPFCConfig, "fpfc_l1": FPFCConfig,
    "fedsoft": FedSoftConfig, "ifca": IFCAConfig, "fedem": FedEMConfig, "fedavg": FedAvgConfig,
    "local": LocalConfig,
}
STREAM_ALGORITHMS = ("ccfl", "fedsoft_async", "local_stream")  # event streams, not synchronous rounds


# --------------------------------------------------------------------------- other sections
PARTITIONS = ("10:90", "30:70", "linear", "random", "clusters")


class DataConfig(Section):
    """Which clients exist and what data each holds (built inside the client actors)."""

    name: Literal["synthetic", "fpfc_synthetic", "fmnist", "emnist_letters", "cifar10", "cifar100"] = "synthetic"
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

    @field_validator("partition", mode="before")
    @classmethod
    def _partition_is_text(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            raise ValueError(f"got the number {v}; quote it, e.g. '10:90' (one of {', '.join(PARTITIONS)})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "DataConfig":
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

    name: Literal["linear", "logistic", "cnn", "cifar_cnn", "resnet18"] = "linear"
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
    address: str | None = Field(None, description="join an existing cluster (auto, ray://, http://)")
    placement: Literal["spread", "pack", "none", "trial"] = Field(
        "spread", description="place client actors with a placement group (SPREAD over nodes, or PACK); none: Ray's "
        "default; trial: in the bundles reserved by the Ray Tune trial that runs the experiment (raysoft sweep)"
    )
    placement_timeout_s: float = Field(
        300.0, gt=0.0, description="seconds to wait for the client actors' resources on a cluster that may "
        "still grow (or is busy) before refusing the run; a plan the cluster can never hold is refused at once"
    )
    round_deadline_s: float | None = Field(
        None, gt=0.0, description="seconds a client call may take; the updates of later actors are "
        "dropped and counted (results then depend on timing)"
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
    def _deadline_needs_ray(self) -> "RayConfig":
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


class Fault(Section):
    """An injected fault: ``kill_actor`` kills client actor ``actor`` at the start of round
    ``at_round``; ``nan_update`` makes client ``client``'s update of that round NaN;
    ``slow_client`` makes client ``client``'s work take ``factor`` times as long from that round on."""

    kind: Literal["kill_actor", "nan_update", "slow_client"]
    at_round: int = Field(ge=0)
    actor: int = Field(0, ge=0)
    client: int = Field(0, ge=0)
    factor: float = Field(1.0, ge=1.0)


class Config(Section):
    """A whole experiment."""

    SECTIONS: ClassVar[tuple[str, ...]] = ("seed", "algorithm", "data", "model", "train", "ray", "output", "faults")

    seed: int = 0
    algorithm: AlgorithmConfig = Field(default_factory=FedSoftConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    faults: list[Fault] = Field(default_factory=list, description="fault injection, for testing recovery")

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
            kind = ALGORITHM_CONFIGS.get(name) if isinstance(name, str) else None
        else:
            return raw
        for key in ("num_centers", "rounds", "tau0") if kind is CCFLConfig else ("num_centers",):
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
        filled = dict(given)
        if "num_centers" in kind.model_fields and "num_centers" not in given:
            filled["num_centers"] = dists
        if kind is CCFLConfig and isinstance(clients, int) and not isinstance(clients, bool):
            cycles = given.get("cycles", CCFLConfig.model_fields["cycles"].default)
            if "rounds" not in given and isinstance(cycles, int) and not isinstance(cycles, bool):
                filled["rounds"] = clients * cycles
            if "tau0" not in given:
                filled["tau0"] = clients
        raw["algorithm"] = algo.model_copy(update=filled) if isinstance(algo, AlgorithmConfig) else filled
        return raw

    @field_validator("algorithm", mode="before")
    @classmethod
    def _dispatch_algorithm(cls, v: Any) -> Any:
        if isinstance(v, AlgorithmConfig):
            return v
        if not isinstance(v, Mapping):
            raise ValueError("must be a mapping with a 'name'")
        name = v.get("name", "fedsoft")
        if not isinstance(name, str) or name not in ALGORITHM_CONFIGS:
            raise ValueError(f"unknown algorithm {name!r} (known: {', '.join(sorted(ALGORITHM_CONFIGS))})")
        return ALGORITHM_CONFIGS[name].model_validate(dict(v))

    @model_validator(mode="after")
    def _cross_section(self) -> "Config":
        algo, data = self.algorithm, self.data
        if algo.clients_per_round > data.clients:
            raise ValueError(
                f"algorithm.clients_per_round ({algo.clients_per_round}) > data.clients ({data.clients})"
            )
        for f in self.faults:
            if f.kind in ("nan_update", "slow_client") and f.client >= data.clients:
                raise ValueError(f"faults: client {f.client} does not exist (data.clients is {data.clients})")
        if isinstance(algo, CCFLConfig):
            if data.name not in ("fmnist", "emnist_letters", "cifar10", "cifar100"):
                raise ValueError(f"algorithm {algo.name}: needs an image dataset (data.name), not {data.name!r}")
            if self.faults:
                raise ValueError(f"algorithm {algo.name}: fault injection is for synchronous rounds only "
                                 "(not for streams)")
            if data.join_schedule is not None and len(data.join_schedule) != data.clients:
                raise ValueError(f"data.join_schedule has {len(data.join_schedule)} entries for {data.clients} clients")
        return self

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved config, defaults included, as plain YAML-able data."""
        return self.model_dump(mode="json", serialize_as_any=True)


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
    elif e["type"] == "missing":
        msg = "required key is missing"
    if e["type"] not in ("extra_forbidden", "missing", "value_error") and "input" in e:
        msg = f"{msg} (got {e['input']!r})"
    return f"{loc}: {msg}" if loc else msg


REGIME_SECTIONS = ("algorithm", "train", "model")


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
        if name not in ALGORITHM_CONFIGS:
            raise ConfigError(f"regimes.{name}: unknown algorithm (known: {', '.join(sorted(ALGORITHM_CONFIGS))})")
        if not isinstance(regime, Mapping):
            raise ConfigError(f"regimes.{name}: must be a mapping of sections")
        for section, keys in regime.items():
            if section not in REGIME_SECTIONS:
                raise ConfigError(f"regimes.{name}.{section}: a regime sets only {', '.join(REGIME_SECTIONS)} keys "
                                  "(the data, seed and resources stay the comparison's)")
            if not isinstance(keys, Mapping) or "name" in keys:
                raise ConfigError(f"regimes.{name}.{section}: must be a mapping of keys (without 'name')")
    algo = out.get("algorithm", {})
    name = algo.name if isinstance(algo, Section) else algo.get("name", "fedsoft") if isinstance(algo, Mapping) else None
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
        raise ConfigError(_format_error(err).replace("\n", " ")) from None


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
