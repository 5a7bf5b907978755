"""The ``train`` section: the clients' local solver."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .section import Section


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
        "auto: on a GPU for every model without batch norm, on the CPU for the linear and logistic models, "
        "where it measured faster (docs/performance.md)"
    )
    gpu_rows: int = Field(
        8, ge=1, description="on a GPU, batched clients are trained in chunks of exactly this many rows (the "
        "last padded), so every kernel has one shape and a client's numbers do not depend on its actor's packing; "
        "about the clients an actor trains a round (more: fewer launches; fewer: less padding)"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where a host trains its clients: auto = CUDA where the process has it (on Ray: "
        "an actor with a GPU share, ray.num_gpus_per_actor); cuda without CUDA is an error"
    )
