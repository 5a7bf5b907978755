"""raysoft's built-in models and datasets, declared: one settings class each, naming the code that
builds it (``implementation``). raysoft's entry points (groups ``raysoft.models`` and
``raysoft.datasets``) register these classes, so that a driver validates a config without
importing torch; :mod:`raysoft.plugins` imports the implementation where a model or a client's
data is built (docs/plugins.md#lazy-plug-ins). Each class holds the keys of its model or dataset
beside the common section's (:class:`~raysoft.config.ModelConfig`,
:class:`~raysoft.config.DataConfig`).
"""

from __future__ import annotations

import importlib.util
import os
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .config import DataConfig, ModelConfig
from .config.data import PARTITION_HELP, BuiltinPartition
from .plugins import Plugin, lookup


# --------------------------------------------------------------------------- models
class LinearModel(ModelConfig):
    """Linear regression (FedSoft's synthetic data)."""

    implementation: ClassVar[str | None] = "raysoft.models:linear"


class LogisticModel(ModelConfig):
    """Multinomial logistic regression."""

    implementation: ClassVar[str | None] = "raysoft.models:logistic"


class ConvModel(ModelConfig):
    """The keys of the built-in convolutional models."""

    memory_format: Literal["contiguous", "channels_last"] = Field(
        "contiguous", description="channels_last pools faster on CPU but measured no faster on W2's images "
        "(docs/performance.md); the same function, float rounding aside"
    )


class CNNModel(ConvModel):
    """Two convolutions and two fully connected layers (FedSoft's letters CNN)."""

    implementation: ClassVar[str | None] = "raysoft.models:cnn"

    channels: list[int] = Field(default_factory=lambda: [32, 64], description="the two convolutions' channels")
    hidden: int = Field(512, ge=1, description="width of the hidden FC layer")

    @field_validator("channels")
    @classmethod
    def _two_channels(cls, v: list[int]) -> list[int]:
        if len(v) != 2 or min(v) < 1:
            raise ValueError("must be two positive integers, e.g. [32, 64]")
        return v


class CifarCNNModel(ConvModel):
    """FedSoft's CIFAR-10 CNN."""

    implementation: ClassVar[str | None] = "raysoft.models:cifar_cnn"


class ResNet18Model(ConvModel):
    """torchvision's ResNet-18 for 32x32 inputs, GroupNorm instead of BatchNorm."""

    implementation: ClassVar[str | None] = "raysoft.models:resnet18"


class LeafCNNModel(ConvModel):
    """LEAF's FEMNIST CNN: two 5x5 convolutions (32, 64 channels), each with ReLU and a 2x2
    max-pool, a dense layer of 2048 and the class logits."""

    implementation: ClassVar[str | None] = "raysoft.models:leaf_cnn"


class CharLSTMModel(ModelConfig):
    """LEAF's character LSTM (Shakespeare's next-character prediction): an embedding of each
    character, stacked LSTM layers, the logits of the next character from the last step."""

    implementation: ClassVar[str | None] = "raysoft.models:char_lstm"

    embedding: int = Field(8, ge=1, description="size of each character's embedding (LEAF: 8)")
    units: int = Field(256, ge=1, description="units of each LSTM layer (LEAF: 256)")
    layers: int = Field(2, ge=1, description="stacked LSTM layers (LEAF: 2)")


# --------------------------------------------------------------------------- datasets
class SyntheticData(DataConfig):
    """FedSoft's synthetic linear regression: S distributions y = x theta_s + noise."""

    implementation: ClassVar[str | None] = "raysoft.data.synthetic:SyntheticRegression"

    partition: BuiltinPartition = Field("10:90", description=PARTITION_HELP)
    dim: int = Field(10, ge=1, description="input dimension d")
    theta_std: float = Field(10.0, gt=0.0, description="sigma_0 of theta_s (paper 10; reference code sqrt(10))")
    noise_std: float = Field(1.0, ge=0.0, description="std of epsilon")

    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ("partition", "dim", "noise_std")


class FPFCSyntheticData(DataConfig):
    """FPFC's synthetic multinomial-logistic clusters (or FedProx's synthetic(alpha, beta))."""

    implementation: ClassVar[str | None] = "raysoft.data.fpfc_synthetic:FPFCSynthetic"

    partition: BuiltinPartition = Field("clusters", description=PARTITION_HELP)
    dim: int = Field(60, ge=1, description="input dimension")
    classes: int = Field(10, ge=2, description="number of classes")
    noise_std: float = Field(0.5, ge=0.0, description="std of the logit noise (generator fpfc)")
    generator: Literal["fpfc", "fedprox"] = Field(
        "fpfc", description="the FPFC code's per-cluster generator, or FedProx's synthetic(alpha, beta) with its "
        "model prior drawn per cluster"
    )
    alpha: float = Field(1.0, ge=0.0, description="generator fedprox: model heterogeneity")
    beta: float = Field(1.0, ge=0.0, description="generator fedprox: feature heterogeneity")

    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ("partition", "dim", "noise_std")


class ImageData(DataConfig):
    """Rotated image mixtures of Fashion-MNIST, EMNIST letters, CIFAR-10 or CIFAR-100, read from
    the dataset's own files (``root``)."""

    implementation: ClassVar[str | None] = "raysoft.data.image_mixture:ImageMixture"

    partition: BuiltinPartition = Field("10:90", description=PARTITION_HELP)
    root: str | None = Field(
        None, description="folder of the files; default $RAYSOFT_DATA, else /usr/share/datasets/fashion-mnist "
        "for fmnist"
    )
    rotations: list[float] | None = Field(
        None, description="rotation (degrees) of each distribution; default i*360/S (emnist_letters: lower/upper "
        "at 0, then both at 90)"
    )
    download: bool = Field(
        False, description="fetch the files on first use where they are missing (torchvision's download and "
        "md5 checks) into root, else $RAYSOFT_DATA, else ~/.cache/raysoft"
    )

    @model_validator(mode="after")
    def _image_checks(self) -> ImageData:
        if self.rotations is not None and len(self.rotations) != self.distributions:
            raise ValueError(f"rotations has {len(self.rotations)} angles but distributions is {self.distributions}")
        if self.name == "emnist_letters" and self.distributions not in (1, 2, 4):
            raise ValueError(f"emnist_letters has 1, 2 or 4 distributions, got {self.distributions}")
        return self


class LeafData(DataConfig):
    """LEAF's natural partitions: FEMNIST (one client per writer, 62 classes of 28x28 characters)
    or Shakespeare (one client per speaking role, next character of 80-character lines), read
    from the JSON files LEAF's preprocessing writes (``root``: the folder of ``train/`` and
    ``test/``). Each client holds its writer's (role's) train samples and, as its own test split,
    the same writer's test samples; the one holdout set is drawn from the chosen clients' test
    samples."""

    implementation: ClassVar[str | None] = "raysoft.data.leaf:LeafClients"

    root: str | None = Field(
        None, description="LEAF's data/<name>/data folder, holding train/*.json and test/*.json; default "
        "$RAYSOFT_DATA/<name>"
    )
    distributions: int = Field(1, ge=1, le=1, description="1: a natural partition has no known clusters")
    partition: Literal["natural"] = Field("natural", description="natural: each client one writer (role)")
    select: Literal["random", "largest", "first"] = Field(
        "random", description="which writers (roles) become the data.clients clients: random (drawn from "
        "data.seed, else the run's seed), largest (most train samples) or first (in the files' order)"
    )
    min_samples: int = Field(1, ge=1, description="writers (roles) with fewer train samples are left out")

    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ("partition", "distributions")

    @field_validator("root")
    @classmethod
    def _absolute_root(cls, v: str | None) -> str | None:
        # pinned on the driver, so that actors (whose working directory is Ray's) find the same folder
        return None if v is None else os.path.abspath(os.path.expanduser(v))


class HFData(DataConfig):
    """A dataset of the Hugging Face hub or a local copy (a folder ``datasets`` saved, Parquet
    files), read with ``datasets`` and split into clients by one of Flower Datasets'
    partitioners (``pip install 'raysoft[hf]'``). Each client's partition is split into its
    train samples and its own test split (``client_test``); the one holdout set is drawn from
    ``test_split`` where the dataset has one, else from the clients' test splits."""

    implementation: ClassVar[str | None] = "raysoft.data.hf:HFClients"

    path: str = Field(
        description="a dataset id of the hub (e.g. flwrlabs/femnist), a folder written by "
        "datasets' save_to_disk, a folder of data files, or Parquet files (a path or glob ending .parquet)"
    )
    subset: str | None = Field(None, description="the dataset's configuration (load_dataset's name)")
    split: str = Field("train", description="the split partitioned into the clients")
    test_split: str | None = Field(None, description="a split of the same dataset for the holdout set")
    features: str = Field("image", description="the input column: images, numbers or text (text: LEAF's "
                                               "80 characters, one token each)")
    label: str = Field("label", description="the label column (class ids, or class names mapped to ids in "
                                            "sorted order; one character each for text)")
    num_classes: int | None = Field(None, ge=2, description="default: the label feature's classes, else the "
                                                             "largest label + 1")
    partitioner: str = Field(
        "IidPartitioner", description="a class of flwr_datasets.partitioner (DirichletPartitioner, "
        "PathologicalPartitioner, NaturalIdPartitioner, ...)"
    )
    partitioner_args: dict[str, object] = Field(
        default_factory=dict, description="its arguments; num_partitions defaults to data.clients, seed to "
        "data.seed (else the run's), partition_by to the label column where the class takes them"
    )
    select: Literal["random", "largest", "first"] = Field(
        "random", description="where the partitioner makes more partitions than data.clients (NaturalId): "
        "which become the clients, as femnist's"
    )
    client_test: float = Field(0.2, ge=0.0, lt=1.0, description="share of each client's partition held out "
                                                                "as its own test split")
    client_test_from: Literal["random", "end"] = Field(
        "random", description="which of a partition's samples make its test split: random (seeded), or the "
        "last ones in the dataset's order (temporal data such as Shakespeare's lines: no leak of the text ahead)"
    )
    distributions: int = Field(1, ge=1, le=1, description="1: the partitions carry no known clusters")
    partition: Literal["flower"] = Field("flower", description="flower: the partitioner's partitions")

    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ("partition", "distributions")

    @field_validator("path")
    @classmethod
    def _local_absolute(cls, v: str) -> str:
        # a local path is pinned on the driver (actors run elsewhere); a hub id stays as written
        expanded = os.path.expanduser(v)
        local = os.path.exists(expanded) or v.startswith((".", "/", "~")) or v.endswith(".parquet")
        return os.path.abspath(expanded) if local else v

    @model_validator(mode="after")
    def _extra_installed(self) -> HFData:
        missing = [m for m in ("datasets", "flwr_datasets") if importlib.util.find_spec(m) is None]
        if missing:
            raise ValueError(f"needs {' and '.join(missing)}: pip install 'raysoft[hf]'")
        return self


class ScenarioData(DataConfig):
    """Heterogeneity scenarios over a labelled classification dataset (``base``): clients in
    ``distributions`` clusters, each cluster its own label map (concept shift) and input
    transform (feature shift), each client's share of its cluster's pool by a label-skew and a
    quantity-skew partition (Flower Datasets' partitioners); docs/scenarios.md."""

    implementation: ClassVar[str | None] = "raysoft.data.scenarios:Scenario"

    partition: Literal["clusters"] = Field(
        "clusters", description="clients are in contiguous blocks: client k is in cluster k*S//N"
    )
    base: str = Field("fmnist", description="the labelled pool: fmnist, emnist_letters (lowercase), cifar10, "
                      "cifar100, or a dataset plug-in with labelled_pool() (docs/plugins.md)")
    base_settings: dict[str, object] = Field(default_factory=dict, description="a plug-in base's own settings")
    root: str | None = Field(None, description="folder of a built-in base's files (as data.root of fmnist ...)")
    pool_samples: int | None = Field(
        None, ge=1, description="use this many samples of the train split (a seeded subset); null: all"
    )
    label_skew: Literal["iid", "dirichlet", "shards"] = Field(
        "iid", description="iid; dirichlet: each class split over the cluster's clients by Dirichlet(alpha) "
        "(with quantity power_law: each client's classes drawn Dirichlet(alpha)); shards: classes_per_client "
        "classes a client"
    )
    alpha: float = Field(0.5, gt=0.0, description="label_skew dirichlet: the concentration")
    classes_per_client: int = Field(2, ge=1, description="label_skew shards: the classes of each client")
    quantity: Literal["equal", "power_law"] = Field(
        "equal", description="client sizes: as the label skew leaves them, or power_law (Pareto(power) weights)"
    )
    power: float = Field(1.5, gt=0.0, description="quantity power_law: the Pareto tail index (smaller: more skew)")
    min_samples: int = Field(10, ge=1, description="the fewest samples a client holds (dirichlet, power_law)")
    concept: Literal["none", "permutation", "swap"] = Field(
        "none", description="cluster s > 0 relabels: a random permutation of the classes, or swaps classes "
        "2(s-1) and 2(s-1)+1"
    )
    feature: Literal["none", "rotation", "brightness", "noise", "blur"] = Field(
        "none", description="each cluster's input transform"
    )
    shift: list[float] | None = Field(
        None, description="the transform's parameter for each cluster: degrees, brightness factor, noise std, "
        "blur sigma; default s*360/S, 1-0.6s/(S-1), 0.3s/(S-1), 1.5s/(S-1)"
    )
    test_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="each client's own test split, from its share")
    samples_min: int = Field(100, ge=1, description="not read: the partition sets the clients' sizes")
    samples_max: int = Field(200, ge=1, description="not read: the partition sets the clients' sizes")

    NULL_IS_DEFAULT: ClassVar[tuple[str, ...]] = ("partition",)

    SCENARIOS: ClassVar[tuple[tuple[str, str, str, str], ...]] = (
        ("dirichlet", "label_skew: dirichlet, alpha: 0.5",
         "label skew: each class split over the clients by Dirichlet(alpha) shares", "jobs/scenario_dirichlet.yaml"),
        ("shards", "label_skew: shards, classes_per_client: 2",
         "label skew: each client holds exactly c classes (pathological shards)", "jobs/scenario_shards.yaml"),
        ("quantity", "quantity: power_law, power: 1.5",
         "quantity skew: client sizes in proportion to Pareto(power) weights, iid labels",
         "jobs/scenario_quantity.yaml"),
        ("permutation", "concept: permutation, distributions: 4",
         "concept shift: each cluster s > 0 relabels by its own random permutation", "jobs/scenario_permutation.yaml"),
        ("swap", "concept: swap, distributions: 2",
         "concept shift: cluster s > 0 swaps classes 2(s-1) and 2(s-1)+1", "jobs/scenario_swap.yaml"),
        ("feature", "feature: rotation|brightness|noise|blur, shift: [...]",
         "feature shift: each cluster its own input transform", "jobs/scenario_feature.yaml"),
        ("composed", "concept: permutation, distributions: 4, label_skew: dirichlet, alpha: 0.5",
         "4 clusters by label permutation, each client Dirichlet(0.5) within its cluster",
         "jobs/scenario_composed.yaml"),
    )
    """(name, its settings, definition, job file): the scenarios ``raysoft list datasets`` shows."""

    @property
    def base_plugin(self) -> Plugin:
        """The dataset ``base`` names (:class:`raysoft.plugins.Plugin`), as :attr:`plugin` for ``name``."""
        return lookup("datasets", self.base)

    @model_validator(mode="after")
    def _scenario_checks(self) -> ScenarioData:
        if self.shift is not None and len(self.shift) != self.distributions:
            raise ValueError(f"shift has {len(self.shift)} values but distributions is {self.distributions}")
        if self.label_skew == "shards" and self.quantity == "power_law":
            raise ValueError("label_skew shards fixes the clients' sizes; use quantity: equal")
        if self.clients < self.distributions:
            raise ValueError(f"{self.clients} clients cannot fill {self.distributions} clusters")
        classes = IMAGE_DATASETS[self.base][1] if self.base in IMAGE_DATASETS else None
        if classes is not None:
            if self.concept == "swap" and 2 * (self.distributions - 1) > classes:
                raise ValueError(f"concept swap needs 2(S-1) <= {classes} classes (S = {self.distributions})")
            if self.label_skew == "shards" and self.classes_per_client > classes:
                raise ValueError(f"classes_per_client {self.classes_per_client} > the {classes} classes of {self.base}")
        return self


# --------------------------------------------------------------------------- which fits which
# name -> ((C, H, W), number of classes)
IMAGE_DATASETS: dict[str, tuple[tuple[int, int, int], int]] = {
    "fmnist": ((1, 28, 28), 10),
    "emnist_letters": ((1, 28, 28), 26),
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
}
IMAGE_MODELS = ("cnn", "cifar_cnn", "resnet18", "leaf_cnn")
SEQUENCE_MODELS = ("char_lstm",)
# LEAF's 80 characters (its models/utils/language_utils.py): a Shakespeare line's tokens and the
# next character's class are indices into this string
LEAF_CHARS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
LEAF_DATASETS: dict[str, tuple[tuple[int, ...], int]] = {  # name -> (input shape, number of classes)
    "femnist": ((1, 28, 28), 62),
    "shakespeare": ((80,), len(LEAF_CHARS)),
}


def data_kind(name: str, base: str | None = None) -> tuple[str, tuple[int, ...] | None]:
    """(task, input shape) of dataset ``name`` (the shape is () for vector data, (L,) for token
    sequences, None where only the data's files tell); a scenario's are its built-in ``base``'s."""
    if name == "scenario" and base in IMAGE_DATASETS:
        return "classification", IMAGE_DATASETS[base][0]
    if name == "synthetic":
        return "regression", ()
    if name in IMAGE_DATASETS:
        return "classification", IMAGE_DATASETS[name][0]
    if name in LEAF_DATASETS:
        return "classification", LEAF_DATASETS[name][0]
    if name == "hf":
        return "classification", None
    return "classification", ()  # fpfc_synthetic


def model_misfit(model: str, task: str, input_shape: tuple[int, ...] | None) -> str | None:
    """Why model ``model`` cannot be built for this data, or None (``input_shape`` None: not
    known yet; the model is checked again against the data it is built for)."""
    if (model == "linear") != (task == "regression"):
        return f"model {model!r} does not fit a {task} task"
    if input_shape is None:
        return None
    if model in IMAGE_MODELS and len(input_shape) != 3:
        return f"model {model!r} needs image data"
    if (model in SEQUENCE_MODELS) != (len(input_shape) == 1):
        if model in SEQUENCE_MODELS:
            return f"model {model!r} needs token sequences (shakespeare, or hf with a text column)"
        return f"model {model!r} does not read token sequences (use char_lstm)"
    return None


MODELS = (LinearModel, LogisticModel, CNNModel, CifarCNNModel, ResNet18Model, LeafCNNModel, CharLSTMModel)
DATASETS = (SyntheticData, FPFCSyntheticData, ImageData, LeafData, HFData, ScenarioData)
