"""A model plug-in: a multilayer perceptron sized from the data (``info.input_dim`` inputs,
``info.num_outputs`` outputs) with hidden layers of ``model.widths`` units.

Use it as ``model: {name: mlp:MLP, widths: [32, 32]}`` from the folder that holds this file.
The class is its own factory: raysoft calls ``MLP(settings, info, generator)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import torch
from pydantic import Field
from torch import nn

from raysoft.sdk import DataInfo, ModelConfig


class MLPSettings(ModelConfig):
    """ModelConfig's keys (``name`` and ``init``, which is used) plus the hidden layers' widths and
    activation."""

    widths: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [64, 64], description="units of each hidden layer; [] is a linear model")
    activation: Literal["relu", "tanh"] = "relu"


class MLP(nn.Module):
    """Linear-activation blocks, then a linear output layer: logits for classification, one value
    per sample (squeezed) for regression. Weights are drawn from ``generator`` as ``init`` says
    (xavier_normal by default), biases uniform in +-1/sqrt(fan_in), so a seed fixes the model."""

    Settings = MLPSettings

    def __init__(self, settings: MLPSettings, info: DataInfo, generator: torch.Generator) -> None:
        super().__init__()
        act = {"relu": nn.ReLU, "tanh": nn.Tanh}[settings.activation]
        layers: list[nn.Module] = [nn.Flatten()]
        width = info.input_dim
        for w in settings.widths:
            layers += [nn.Linear(width, w), act()]
            width = w
        layers.append(nn.Linear(width, info.num_outputs))
        self.net = nn.Sequential(*layers)
        self.regression = info.task == "regression"
        for m in self.net:
            if isinstance(m, nn.Linear):
                if settings.init == "xavier_normal":
                    nn.init.xavier_normal_(m.weight, generator=generator)
                elif settings.init == "normal":
                    nn.init.normal_(m.weight, generator=generator)
                else:
                    nn.init.kaiming_uniform_(m.weight, a=5**0.5, generator=generator)
                bound = 1 / m.in_features**0.5
                nn.init.uniform_(m.bias, -bound, bound, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        return out.squeeze(-1) if self.regression else out


if TYPE_CHECKING:  # mypy checks MLP against the model-factory protocol (pyproject.toml: [tool.mypy] files)
    from raysoft.sdk import ModelFactory

    _: ModelFactory[MLPSettings] = MLP
