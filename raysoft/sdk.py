"""The public surface a plug-in imports: ``from raysoft.sdk import ...``.

Everything named in ``__all__`` is stable: it keeps its name and signature across minor
versions, and a change to it is written in the changelog of docs/plugins.md (its last section,
"Changelog"). Anything else under ``raysoft`` is internal and may change without notice. The
protocols (what an algorithm, a stream algorithm, a model factory, a dataset and a callback must
provide) are types here (:class:`Algorithm`, :class:`Clustered`, :class:`StreamAlgorithm`,
:class:`ModelFactory`, :class:`Dataset`, :class:`LabelledPool`, :class:`CallbackHooks`), so
mypy checks a plug-in against them (``_: type[Algorithm] = MyAlgorithm``), and are documented in
docs/plugins.md, on real examples (``examples/``).

This module imports torch (the algorithm building blocks need it); a driver that only validates
configs never imports it.
"""

from __future__ import annotations

from .algorithms.base import (
    Algorithm,
    ClientCall,
    ClientContext,
    ClientOp,
    Clustered,
    Configured,
    EvalResult,
    OptionalHooks,
    Plan,
    Reduced,
    Reduction,
    RoundGenerator,
    RoundResult,
    ServerContext,
    Update,
    WeightedMean,
)
from .algorithms.common import (
    evaluate_vector,
    own_data_metrics,
    proximal_pull,
    scratch_optimizer,
    select_uniform,
    served_metrics,
    served_vector_metrics,
    train_from,
    uniform_selection,
)
from .algorithms.stream import (
    StreamAlgorithm,
    StreamClient,
    StreamConfig,
    ValSets,
    client_update,
    nbytes,
    pretrain,
)
from .callbacks import Callback, RunInfo
from .config import AlgorithmConfig, CallbackConfig, Config, DataConfig, ModelConfig, Sections, TrainConfig
from .data import ClientData
from .data.streams import StreamSource
from .devices import device_slips, to_device, to_numpy
from .errors import ConfigError, RaysoftError, Refusal, RunFailure
from .models import DataInfo
from .optim import SGD, Adam
from .params import Params, get_flat, set_flat, weighted_sum
from .plugins import PluginError
from .protocols import CallbackHooks, Dataset, DriftingDataset, LabelledPool, ModelFactory
from .rng import numpy_rng, torch_generator
from .training import evaluate, make_optimizer, model_losses, per_sample_loss, proximal_train

__all__ = [
    # settings: subclass one of these and set it as your plug-in's ``Settings``
    "AlgorithmConfig", "StreamConfig", "DataConfig", "ModelConfig", "CallbackConfig", "Config", "TrainConfig",
    "Sections",
    # synchronous algorithms: the protocols and the round's types
    "Algorithm", "Clustered", "Configured", "ClientCall", "ClientContext", "ClientOp", "ServerContext",
    "RoundGenerator", "RoundResult", "EvalResult", "WeightedMean", "Reduction", "Plan", "Reduced", "Update",
    "OptionalHooks",
    # asynchronous streams
    "StreamAlgorithm", "StreamClient", "ValSets", "client_update", "nbytes", "pretrain", "StreamSource",
    "DriftingDataset",
    # building blocks of client and server halves
    "uniform_selection", "select_uniform", "scratch_optimizer", "train_from", "proximal_pull", "evaluate_vector",
    "own_data_metrics", "served_metrics", "served_vector_metrics",
    "proximal_train", "make_optimizer", "evaluate", "model_losses", "per_sample_loss",
    "Params", "get_flat", "set_flat", "weighted_sum", "numpy_rng", "torch_generator", "Adam", "SGD",
    # devices: a client op's tensors live on ctx.device (ctx.tensor makes one there); to numpy only through this
    "to_numpy", "to_device", "device_slips",
    # models and datasets: their protocols and types
    "ModelFactory", "Dataset", "LabelledPool", "DataInfo", "ClientData",
    # callbacks: the protocol, a base class with no-op hooks, what a callback knows of its run
    "CallbackHooks", "Callback", "RunInfo",
    # errors
    "RaysoftError", "Refusal", "RunFailure", "ConfigError", "PluginError",
]
