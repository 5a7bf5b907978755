"""Pieces shared by several algorithms: uniform client selection, evaluating a parameter
vector on a client's data, and training a vector from a client's persisting optimizer state."""

from __future__ import annotations

from typing import Any, TypedDict, Unpack

import numpy as np
import torch

from ..optim import SGD, Adam
from ..params import Params, get_flat, set_flat
from ..rng import numpy_rng
from ..training import evaluate, make_optimizer, model_losses, proximal_train
from .base import ClientContext, ServerContext


def uniform_selection(num_clients: int, k: int, rng: np.random.Generator) -> list[int]:
    """k distinct clients drawn uniformly (sorted)."""
    return sorted(int(c) for c in rng.choice(num_clients, size=min(k, num_clients), replace=False))


def select_uniform(ctx: ServerContext, k: int, rng: np.random.Generator) -> list[int]:
    """k distinct training clients (``ctx.pool``) drawn uniformly (sorted); with no client held
    out, exactly :func:`uniform_selection` over every client."""
    if not ctx.held_out:
        return uniform_selection(ctx.num_clients, k, rng)
    pool = np.asarray(ctx.pool)
    return sorted(int(c) for c in rng.choice(pool, size=min(k, pool.size), replace=False))


def scratch_optimizer(ctx: ClientContext) -> Adam | SGD:
    """A client's own optimizer state, bound to the host's scratch model when used."""
    return make_optimizer(ctx.cfg.train, ctx.scratch.parameters())


class TrainOptions(TypedDict, total=False):
    """The keywords :func:`train_from` hands to :func:`~raysoft.training.proximal_train`."""

    pull_scale: float
    pull_target: Params | None
    sample_weights: torch.Tensor | None
    epochs: int | None


def train_from(ctx: ClientContext, opt: Adam | SGD, start: Params, t: int, tag: str = "shuffle",
               **kw: Unpack[TrainOptions]) -> Params:
    """Load ``start`` into the scratch model, train it locally with the client's optimizer
    state ``opt`` (bound to the scratch model here) and return the trained vector.

    The local solver is the ``train`` section's (``local_epochs`` passes of mini-batches of
    ``batch_size``). ``tag`` names the random stream of the mini-batch order,
    ``(cfg.seed, tag, client, t)``: the default ``"shuffle"`` is the built-ins' own, so the same
    client in the same round sees its batches in the same order; another tag draws an order of
    its own (a second training pass in one round). ``kw`` goes to
    :func:`~raysoft.training.proximal_train`: ``pull_scale`` (a) and ``pull_target`` (b, a
    vector like ``start``) add ``a * w - b`` to every mini-batch gradient (a proximal pull
    towards ``b / a``; :func:`proximal_pull` makes them), ``sample_weights`` (one per sample)
    weighs each sample's loss, ``epochs`` overrides ``train.local_epochs``."""
    set_flat(ctx.scratch, start)
    opt.bind(ctx.scratch.parameters())
    proximal_train(ctx.scratch, opt, ctx.data.x, ctx.data.y, ctx.info.task, ctx.cfg.train,
                   rng=numpy_rng(ctx.cfg.seed, tag, ctx.client, t), **kw)
    return get_flat(ctx.scratch)


def proximal_pull(mu: float, anchor: Params) -> TrainOptions:
    """The keyword arguments of :func:`train_from` (``pull_scale``, ``pull_target``) that add
    the gradient of (mu / 2) ||w - anchor||^2, i.e. ``mu * w - mu * anchor``, to the data
    gradient (FedProx's proximal term); none when mu is 0, so that the local solver is plain
    training, bit for bit."""
    if mu == 0:
        return {}
    return {"pull_scale": mu, "pull_target": mu * anchor}


def own_data_metrics(ctx: ClientContext, model: torch.nn.Module) -> dict[str, float]:
    """Metrics of ``model`` on the client's own training data and, where the client has a test
    split, on it too (prefixed ``test_``)."""
    out = evaluate(model, ctx.data.x, ctx.data.y, ctx.info.task)
    if ctx.data.test_x is not None and ctx.data.test_y is not None:
        out.update(
            {f"test_{k}": v for k, v in evaluate(model, ctx.data.test_x, ctx.data.test_y, ctx.info.task).items()}
        )
    return out


def served_metrics(ctx: ClientContext, model: torch.nn.Module) -> dict[str, float]:
    """A client's served model on its test split (its own, else the one drawn for it,
    :meth:`~raysoft.data.ClientData.test_split`), as every row of ``client_metrics.parquet`` is
    scored (:func:`~raysoft.evaluation.score_client`): what a held-out client's cold start returns."""
    from ..evaluation import score_client

    split = ctx.data.test_split()
    if split is None:
        raise ValueError(f"client {ctx.client} has no test split to be scored on")
    return score_client(model, split[0], split[1], ctx.info.task)


def served_vector_metrics(ctx: ClientContext, vec: Params) -> dict[str, float]:
    """:func:`served_metrics` of the parameter vector ``vec``."""
    set_flat(ctx.scratch, vec)
    return served_metrics(ctx, ctx.scratch)


def evaluate_vector(ctx: ClientContext, vec: Params) -> dict[str, float]:
    """:func:`own_data_metrics` of the parameter vector ``vec``."""
    set_flat(ctx.scratch, vec)
    return own_data_metrics(ctx, ctx.scratch)


def mean_losses(ctx: ClientContext, vectors: torch.Tensor) -> torch.Tensor:
    """[m] average loss of each vector over the client's whole training set."""
    return model_losses(ctx.scratch, vectors, ctx.data.x, ctx.data.y, ctx.info.task).mean(dim=1)


def batched_local_train(ctxs: list[ClientContext], models: list[torch.nn.Module] | None, opts: list,
                        t: int, start: torch.Tensor | None = None, **pull: Any) -> list[Params]:
    """Train several clients of one host at once (:func:`raysoft.batched.batched_proximal_train`)
    from their own ``models`` (written back in place) or, with ``models`` None, all from the
    vector ``start``; return each client's trained vector."""
    from ..batched import batched_proximal_train

    ctx = ctxs[0]
    if models is not None:
        w0 = torch.stack([get_flat(m) for m in models])
    elif start is not None:
        w0 = start[None, :].expand(len(ctxs), -1).clone()
    else:
        raise ValueError("batched_local_train needs the clients' models or a start vector")
    w = batched_proximal_train(
        ctx.scratch, w0, opts, [c.data.x for c in ctxs], [c.data.y for c in ctxs], ctx.info.task, ctx.cfg.train,
        [numpy_rng(ctx.cfg.seed, "shuffle", c.client, t) for c in ctxs], **pull,
        rows=ctx.cfg.train.gpu_rows if ctx.device.type == "cuda" else None,
    )
    if models is not None:
        for m, row in zip(models, w):
            set_flat(m, row)
    return [row.clone() for row in w]
