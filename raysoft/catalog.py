"""raysoft's built-in models and datasets, declared: one settings class each, naming the code that
builds it (``implementation``). raysoft's entry points (groups ``raysoft.models`` and
``raysoft.datasets``) register these classes, so that a driver validates a config without
importing torch; :mod:`raysoft.plugins` imports the implementation where a model or a client's
data is built (docs/plugins.md#lazy-plug-ins). Each class holds the keys of its model or dataset
beside the common section's (:class:`~raysoft.config.ModelConfig`,
:class:`~raysoft.config.DataConfig`).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .config import DataConfig, ModelConfig
from .config.data import PARTITION_HELP, BuiltinPartition


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

    @model_validator(mode="after")
    def _image_checks(self) -> ImageData:
        if self.rotations is not None and len(self.rotations) != self.distributions:
            raise ValueError(f"rotations has {len(self.rotations)} angles but distributions is {self.distributions}")
        if self.name == "emnist_letters" and self.distributions not in (1, 2, 4):
            raise ValueError(f"emnist_letters has 1, 2 or 4 distributions, got {self.distributions}")
        return self


# --------------------------------------------------------------------------- which fits which
# name -> ((C, H, W), number of classes)
IMAGE_DATASETS: dict[str, tuple[tuple[int, int, int], int]] = {
    "fmnist": ((1, 28, 28), 10),
    "emnist_letters": ((1, 28, 28), 26),
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
}
IMAGE_MODELS = ("cnn", "cifar_cnn", "resnet18")


def data_kind(name: str) -> tuple[str, tuple[int, ...]]:
    """(task, input shape) of dataset ``name`` (the shape is () for vector data)."""
    if name == "synthetic":
        return "regression", ()
    if name in IMAGE_DATASETS:
        return "classification", IMAGE_DATASETS[name][0]
    return "classification", ()  # fpfc_synthetic


def model_misfit(model: str, task: str, input_shape: tuple[int, ...]) -> str | None:
    """Why model ``model`` cannot be built for this data, or None."""
    if (model == "linear") != (task == "regression"):
        return f"model {model!r} does not fit a {task} task"
    if model in IMAGE_MODELS and len(input_shape) != 3:
        return f"model {model!r} needs image data"
    return None


MODELS = (LinearModel, LogisticModel, CNNModel, CifarCNNModel, ResNet18Model)
DATASETS = (SyntheticData, FPFCSyntheticData, ImageData)
