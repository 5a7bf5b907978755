"""The ``model`` section's base: the keys every model has. A model's own settings subclass it
with its own keys (:mod:`raysoft.catalog` for the built-ins, docs/plugins.md for a plug-in's)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .section import PluginSection


class ModelConfig(PluginSection):
    """The model every client trains, built from the data's shape: ``name`` names it, ``init``
    how its weights are drawn."""

    KIND = "models"
    name: str = Field("linear", description="linear, logistic, cnn, cifar_cnn, resnet18, a registered model or an "
                      "import path (docs/plugins.md)")
    init: Literal["xavier_normal", "torch_default", "normal"] = "xavier_normal"
