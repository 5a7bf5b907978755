"""raysoft's built-in models and datasets, declared: one settings class each, naming the code that
builds it (``implementation``). raysoft's entry points (groups ``raysoft.models`` and
``raysoft.datasets``) register these classes, so that a driver validates a config without
importing torch; :mod:`raysoft.plugins` imports the implementation where a model or a client's
data is built (docs/plugins.md#lazy-plug-ins). The keys are the common sections' own
(:class:`~raysoft.config.ModelConfig`, :class:`~raysoft.config.DataConfig`).
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic import model_validator

from .config import DataConfig, ModelConfig

_D = TypeVar("_D", bound=DataConfig)


# --------------------------------------------------------------------------- models
class LinearModel(ModelConfig):
    """Linear regression (FedSoft's synthetic data)."""

    implementation: ClassVar[str | None] = "raysoft.models:linear"


class LogisticModel(ModelConfig):
    """Multinomial logistic regression."""

    implementation: ClassVar[str | None] = "raysoft.models:logistic"


class CNNModel(ModelConfig):
    """Two convolutions and two fully connected layers (FedSoft's letters CNN; ``channels``,
    ``hidden``)."""

    implementation: ClassVar[str | None] = "raysoft.models:cnn"


class CifarCNNModel(ModelConfig):
    """FedSoft's CIFAR-10 CNN."""

    implementation: ClassVar[str | None] = "raysoft.models:cifar_cnn"


class ResNet18Model(ModelConfig):
    """torchvision's ResNet-18 for 32x32 inputs, GroupNorm instead of BatchNorm."""

    implementation: ClassVar[str | None] = "raysoft.models:resnet18"


# --------------------------------------------------------------------------- datasets
def _refuse_rotations(cfg: _D) -> _D:
    if cfg.rotations is not None:
        raise ValueError(f"rotations is for image datasets, not {cfg.name}")
    return cfg


class SyntheticData(DataConfig):
    """FedSoft's synthetic linear regression: S distributions y = x theta_s + noise."""

    implementation: ClassVar[str | None] = "raysoft.data.synthetic:SyntheticRegression"

    @model_validator(mode="after")
    def _no_rotations(self) -> SyntheticData:
        return _refuse_rotations(self)


class FPFCSyntheticData(DataConfig):
    """FPFC's synthetic multinomial-logistic clusters (or FedProx's synthetic(alpha, beta))."""

    implementation: ClassVar[str | None] = "raysoft.data.fpfc_synthetic:FPFCSynthetic"
    DEFAULTS: ClassVar[dict[str, Any]] = {"partition": "clusters", "dim": 60, "noise_std": 0.5}

    @model_validator(mode="after")
    def _no_rotations(self) -> FPFCSyntheticData:
        return _refuse_rotations(self)


class ImageData(DataConfig):
    """Rotated image mixtures of Fashion-MNIST, EMNIST letters, CIFAR-10 or CIFAR-100, read from
    the dataset's own files (``root``)."""

    implementation: ClassVar[str | None] = "raysoft.data.image_mixture:ImageMixture"

    @model_validator(mode="after")
    def _emnist_distributions(self) -> ImageData:
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
