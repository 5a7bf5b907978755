"""The settings of raysoft's built-in algorithms: one typed class each, the ``Settings`` of the
algorithm whose module names it, and the object that algorithm receives.

They are declared in this light module (pydantic only, no torch), and each names its
implementation (``implementation``, a ``module:Class`` path), so that a driver validates a
config without importing torch or the algorithms' code: raysoft's entry points register these
classes, and :mod:`raysoft.plugins` imports the implementation only where it runs
(docs/plugins.md#lazy-plug-ins). Their keys and defaults are documented in docs/running.md and
docs/algorithms.md; ``raysoft list algorithms`` prints them.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from ..config import AlgorithmConfig, Sections


class FedSoftConfig(AlgorithmConfig):
    """FedSoft (Ruan & Joe-Wong, AAAI'22), Algorithm 1; defaults from the paper/reference code."""

    implementation: ClassVar[str | None] = "raysoft.algorithms.fedsoft:FedSoft"

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

    implementation: ClassVar[str | None] = "raysoft.algorithms.ifca:IFCA"

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
    assignment: Literal["loss", "oracle"] = Field(
        "loss", description="loss: each client joins its lowest-loss center (IFCA); oracle: center s holds the "
        "clients whose majority distribution is s (their true cluster): FedAvg per true cluster, the ceiling a "
        "hard clustering can reach (needs num_centers = data.distributions)"
    )

    def check_with(self, cfg: Sections) -> None:
        if self.assignment == "oracle" and self.num_centers != cfg.data.distributions:
            raise ValueError(f"algorithm.assignment oracle needs num_centers = data.distributions "
                             f"({cfg.data.distributions}), not {self.num_centers}")


class FedAvgConfig(AlgorithmConfig):
    """FedAvg: one global model, n_k-weighted average of the selected clients' models."""

    implementation: ClassVar[str | None] = "raysoft.algorithms.fedavg:FedAvg"

    name: Literal["fedavg"] = "fedavg"


class LocalConfig(AlgorithmConfig):
    """Local: every selected client trains its own model; no communication."""

    implementation: ClassVar[str | None] = "raysoft.algorithms.fedavg:Local"

    name: Literal["local"] = "local"


class FedEMConfig(AlgorithmConfig):
    """FedEM (Marfoq et al., NeurIPS'21): M shared learners, per-client mixture weights pi."""

    implementation: ClassVar[str | None] = "raysoft.algorithms.fedem:FedEM"

    name: Literal["fedem"] = "fedem"
    num_centers: int = Field(2, ge=1, description="M learners; default data.distributions")
    lr_milestones: list[int] = Field(
        default_factory=list,
        description="multiply the lr by lr_decay after this many of the client's own rounds "
        "(the reference code steps its scheduler once per round the client is sampled)",
    )
    lr_decay: float = Field(0.1, gt=0.0, le=1.0)
    unseen_em_steps: int | None = Field(
        None, ge=1, description="a held-out client's EM steps on its mixture weights with the learners frozen "
        "(null: until they stop moving, at most 500; 1: the reference code's one E-step and pi update)"
    )


class FPFCConfig(AlgorithmConfig):
    """FPFC (Yu et al., AAAI'23): fusion-penalized federated clustering; defaults are the
    reference code's synthetic settings (docs/algorithms.md#fpfc-defaults)."""

    implementation: ClassVar[str | None] = "raysoft.algorithms.fpfc:FPFC"

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
    def _xi_below_lambda(self) -> FPFCConfig:
        if self.xi >= self.lam:
            raise ValueError(f"xi ({self.xi}) must be < lam ({self.lam})")
        if self.name == "fpfc" and self.rho * (self.a - 1) <= 1:
            raise ValueError(f"rho * (a - 1) must exceed 1 for the SCAD prox (got {self.rho * (self.a - 1):g})")
        return self


class StreamConfig(AlgorithmConfig):
    """The keys every stream algorithm has (CCFL, FedSoft-Async, the stream Local and a user's
    own): an asynchronous stream of uploads on any classification dataset (the rotated image
    mixtures drift; another dataset drifts where it says how, raysoft.data.streams). ``rounds``
    is the number of uploads (global epochs T; default clients x cycles), ``eval_every`` the
    uploads between cluster evaluations. Defaults: the CCFL paper's FashionMNIST (4 clusters)
    setting. CCFL's pre-training and proximal term are CCFLConfig's (``pretrain_epochs``,
    ``shared_init``, ``rho``)."""

    rounds: int = Field(2000, ge=1, description="uploads T; default data.clients x cycles")
    cycles: int = Field(25, ge=1, description="average upload-download cycles per client (FMNIST: 25)")
    clients_per_round: int = Field(1, ge=1, description="unused: clients upload when their clock says")
    eval_every: int = Field(100, ge=1, description="uploads between cluster evaluations")
    mode: Literal["virtual", "realtime"] = Field(
        "virtual", description="virtual: uploads applied in virtual-time order (reproducible); "
        "realtime: in arrival order"
    )
    local_epochs: int | None = Field(
        None, ge=1, description="H, the local epochs of a client's cycle; null: train.local_epochs"
    )
    client_starts_from_reply: bool = Field(
        True, description="a client trains from the reply it received (also its prox anchor); false: from its "
        "own last local model"
    )
    public_samples: int = Field(2000, ge=1, description="the server's samples per cluster (its validation set D_k; "
                                "CCFL pre-trains on them): images of the test split, or a dataset's holdout's first")
    upload_rate: list[float] = Field(
        default_factory=lambda: [0.5, 2.0],
        description="each client's upload clock: exponential gaps with a rate drawn from U[min, max]",
    )
    drift: bool = Field(True, description="fresh data after every cycle (where the dataset drifts); false: the "
                        "first dataset stays")
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
    max_silent_ticks: int = Field(
        4, ge=0, description="upload_policy shift: upload anyway after this many silent ticks"
    )

    stream: ClassVar[bool] = True  # an asynchronous stream (raysoft.plugins.is_stream_algorithm)
    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ("num_centers", "rounds", "tau0", "cycle_uploads")

    @classmethod
    def fill_defaults(cls, given: dict[str, object], clients: object, distributions: object) -> dict[str, object]:
        """The base's defaults, and the uploads T = data.clients x cycles (and, where the settings
        have it, the staleness bound tau0 and the uploads of a client cycle = data.clients)."""
        filled = super().fill_defaults(given, clients, distributions)
        if isinstance(clients, int) and not isinstance(clients, bool):
            cycles = given.get("cycles", cls.model_fields["cycles"].default)
            # an invalid cycles (0, a string) is left to its own validation, which names it
            if "rounds" not in given and isinstance(cycles, int) and not isinstance(cycles, bool) and cycles >= 1:
                filled["rounds"] = clients * cycles
            for key in ("tau0", "cycle_uploads"):
                if key in cls.model_fields and key not in given:
                    filled[key] = clients
        return filled

    @model_validator(mode="after")
    def _stream_checks(self) -> StreamConfig:
        if len(self.upload_rate) != 2 or not 0 < self.upload_rate[0] <= self.upload_rate[1]:
            raise ValueError("upload_rate must be [min, max] with 0 < min <= max")
        return self

    def check_with(self, cfg: Sections) -> None:
        """Checks against the other sections: a stream runs on a classification dataset (any
        other: its task is checked when its data is made), without faults."""
        from ..catalog import data_kind

        data = cfg.data
        if data.name == "synthetic" and data_kind(data.name)[0] == "regression":
            raise ValueError(f"algorithm {self.name}: a stream scores accuracy, so it needs a classification "
                             f"dataset (data.name {data.name!r} is regression)")
        if cfg.faults:
            raise ValueError(f"algorithm {self.name}: fault injection is for synchronous rounds only (not for streams)")
        if data.join_schedule is not None and len(data.join_schedule) != data.clients:
            raise ValueError(f"data.join_schedule has {len(data.join_schedule)} entries for {data.clients} clients")


class CCFLConfig(StreamConfig):
    """CCFL, its FedSoft-Async baseline and Local (``local_stream``: no server, each client
    keeps training its own model on its drifting data): an asynchronous stream of uploads.
    ``rounds`` is the number of uploads (global epochs T; default clients x cycles), ``eval_every``
    the uploads between cluster evaluations. Defaults: the CCFL paper's FashionMNIST (4 clusters)
    row of Table 2 and section 5.1; :func:`raysoft.algorithms.ccfl.table2_settings` gives the
    other rows. The choices where the paper is ambiguous are documented in docs/algorithms.md."""

    implementation: ClassVar[str | None] = "raysoft.algorithms.ccfl:CCFL"

    name: Literal["ccfl", "fedsoft_async", "local_stream"] = "ccfl"
    rho: float = Field(0.1, ge=0.0, description="weight of the client's proximal term (rho/2)||w - wbar||^2")
    pretrain_epochs: int = Field(5, ge=0, description="epochs of pre-training each cluster model [GUESS]")
    shared_init: bool = Field(
        True, description="every cluster model starts from the same random initialisation before pre-training "
        "(so that the initial reply, their average, is a working model) [GUESS]; false: one per cluster"
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
    staleness_clock: Literal["uploads", "client_cycles", "cluster_updates"] = Field(
        "uploads", description="the unit of alpha2's gap t_k - tau (docs/algorithms.md#ccfl-staleness-clock): "
        "uploads (every upload is a global epoch, Algorithm 2 as written), client_cycles (the gap over "
        "cycle_uploads, the uploads of one cycle of every client) or cluster_updates (the updates cluster k "
        "received since the client's download)"
    )
    cycle_uploads: int = Field(80, ge=1, description="staleness_clock client_cycles: uploads in one client cycle; "
                               "default data.clients")
    adjust_start: float | None = Field(0.5, ge=0.0, le=1.0, description="null: no global adjustment")
    adjust_percentile: float = Field(70.0, ge=0.0, le=100.0)
    sigma: float = Field(1e-4, ge=0.0, le=1.0, description="fedsoft_async: floor of the clients' mixture estimates")

    @model_validator(mode="after")
    def _ccfl_checks(self) -> CCFLConfig:
        if self.c1 + self.c2 > 1:
            raise ValueError(f"c1 + c2 must be <= 1 (got {self.c1 + self.c2:g})")
        if not self.amplifier or min(self.amplifier) <= 0:
            raise ValueError("amplifier must list positive values")
        return self


class FedSoftAsyncConfig(CCFLConfig):
    """FedSoft-Async, CCFL's asynchronous baseline: the CCFL comparison's keys (it reads alpha0,
    a, b, tau0 and sigma), so one job file runs the three streams."""

    implementation: ClassVar[str | None] = "raysoft.algorithms.fedsoft_async:FedSoftAsync"


class LocalStreamConfig(CCFLConfig):
    """Local on a stream, CCFL's Local baseline: the CCFL comparison's keys."""

    implementation: ClassVar[str | None] = "raysoft.algorithms.local_stream:LocalStream"
