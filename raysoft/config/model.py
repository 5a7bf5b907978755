"""The ``model`` section's base. A model's own settings subclass it (:mod:`raysoft.catalog` for the
built-ins)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from .section import Section


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
