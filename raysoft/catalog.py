"""raysoft's built-in models and datasets, declared: one settings class each, naming the code that
builds it (``implementation``). raysoft's entry points (groups ``raysoft.models`` and
``raysoft.datasets``) register these classes, so that a driver validates a config without
importing torch; :mod:`raysoft.plugins` imports the implementation where a model or a client's
data is built (docs/plugins.md#lazy-plug-ins). The keys are the common sections' own
(:class:`~raysoft.config.ModelConfig`, :class:`~raysoft.config.DataConfig`).
"""

from __future__ import annotations

from typing import ClassVar

from .config import DataConfig, ModelConfig


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
class SyntheticData(DataConfig):
    """FedSoft's synthetic linear regression: S distributions y = x theta_s + noise."""

    implementation: ClassVar[str | None] = "raysoft.data.synthetic:SyntheticRegression"


class FPFCSyntheticData(DataConfig):
    """FPFC's synthetic multinomial-logistic clusters (or FedProx's synthetic(alpha, beta))."""

    implementation: ClassVar[str | None] = "raysoft.data.fpfc_synthetic:FPFCSynthetic"


class ImageData(DataConfig):
    """Rotated image mixtures of Fashion-MNIST, EMNIST letters, CIFAR-10 or CIFAR-100, read from
    the dataset's own files (``root``)."""

    implementation: ClassVar[str | None] = "raysoft.data.image_mixture:ImageMixture"


MODELS = (LinearModel, LogisticModel, CNNModel, CifarCNNModel, ResNet18Model)
DATASETS = (SyntheticData, FPFCSyntheticData, ImageData)
