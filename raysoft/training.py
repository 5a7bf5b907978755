"""Local solvers and per-sample losses, shared by every algorithm.

The proximal solver minimises f_k(w) + (1/2) * a * ||w||^2 - <b, w> (+ const) by mini-batch
SGD/Adam, i.e. adds ``a * w - b`` to the data gradient. FedSoft's objective (4) is the case
a = lambda * sum_s u_ks and b = lambda * sum_s u_ks c_s (its gradient (5)); FedProx-style
pulls towards one anchor are a = mu, b = mu * anchor; plain local training is a = 0, b = 0.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import TrainConfig
from .optim import SGD, Adam
from .params import Params, set_flat, views_like


def per_sample_loss(out: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    """Loss of each sample: squared error (regression) or cross-entropy (classification)."""
    if task == "regression":
        return (out - y) ** 2
    return F.cross_entropy(out, y, reduction="none")


EVAL_CHUNK = 128  # samples per forward pass when scoring: chunks keep the activations held at once
#   small, and scored faster than one huge batch on a CPU (docs/performance.md)


@torch.no_grad()
def outputs(model: nn.Module, x: torch.Tensor, chunk: int = EVAL_CHUNK) -> torch.Tensor:
    """model(x) without gradients, in chunks of ``chunk`` samples (one huge batch is slower on
    the CPU and holds every activation at once)."""
    if len(x) <= chunk:
        return model(x)
    return torch.cat([model(x[i : i + chunk]) for i in range(0, len(x), chunk)])


@torch.no_grad()
def model_losses(model: nn.Module, vectors: torch.Tensor, x: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    """[m, n] per-sample losses of each parameter vector in ``vectors`` ([m, d]) on (x, y).

    ``model`` is a scratch module whose parameters are overwritten.
    """
    model.eval()
    rows = []
    for vec in vectors:
        set_flat(model, vec)
        rows.append(per_sample_loss(outputs(model, x), y, task))
    return torch.stack(rows)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: str) -> dict[str, float]:
    """Metrics of a model on (x, y): ``mse`` for regression; ``loss`` and ``accuracy`` otherwise."""
    model.eval()
    out = outputs(model, x)
    losses = per_sample_loss(out, y, task)
    if task == "regression":
        return {"mse": float(losses.mean())}
    return {"loss": float(losses.mean()), "accuracy": float((out.argmax(-1) == y).float().mean())}


def make_optimizer(cfg: TrainConfig, params) -> Adam | SGD:
    """The client optimizer; it is created once per client and persists across rounds."""
    if cfg.optimizer == "adam":
        return Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def batch_order(n: int, epoch: int, cfg: TrainConfig, rng: np.random.Generator | None) -> np.ndarray:
    """Sample order of one epoch: fixed (reference code) or a fresh permutation."""
    if cfg.shuffle:
        if rng is None:
            raise ValueError("train.shuffle needs a random generator")
        return rng.permutation(n)
    return np.arange(n)


def proximal_train(
    model: nn.Module,
    optimizer: Adam | SGD,
    x: torch.Tensor,
    y: torch.Tensor,
    task: str,
    cfg: TrainConfig,
    pull_scale: float = 0.0,
    pull_target: Params | None = None,
    rng: np.random.Generator | None = None,
    sample_weights: torch.Tensor | None = None,
    epochs: int | None = None,
) -> float:
    """Run ``cfg.local_epochs`` (or ``epochs``) epochs of mini-batch training in place; return
    the last epoch's mean loss.

    The batch loss is (1/B) sum_i q_i loss_i, with q = ``sample_weights`` (1 if None; FedEM's
    responsibilities), and its gradient gets  pull_scale * w - pull_target  added.
    """
    model.train()
    params = [p for p in model.parameters()]
    optimizer.bind(params)  # it updates ``model``: a kept optimizer comes back unbound from a move or a checkpoint
    target = views_like(pull_target, model) if pull_target is not None else None
    n = int(y.shape[0])
    total = torch.zeros((), dtype=torch.float64, device=y.device)
    for epoch in range(cfg.local_epochs if epochs is None else epochs):
        # the epoch's order on the data's device once, and the losses summed there: no host-device
        # wait per mini-batch (float64, in the order Python's float sum took: the same number)
        order = torch.as_tensor(batch_order(n, epoch, cfg, rng), device=y.device)
        total = torch.zeros((), dtype=torch.float64, device=y.device)
        batch = cfg.batch_size or n
        for start in range(0, n, batch):
            idx = order[start : start + batch]
            xb, yb = x[idx], y[idx]
            optimizer.zero_grad(set_to_none=False)
            losses = per_sample_loss(model(xb), yb, task)
            loss = (losses * sample_weights[idx]).mean() if sample_weights is not None else losses.mean()
            loss.backward()
            if pull_scale or target is not None:
                with torch.no_grad():
                    for i, p in enumerate(params):
                        grad = cast(torch.Tensor, p.grad)
                        if pull_scale:
                            grad.add_(p, alpha=pull_scale)
                        if target is not None:
                            grad.sub_(target[i])
            optimizer.step()
            total += loss.detach().double() * len(idx)
    return float(total) / n if n else 0.0


def full_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: str) -> Params:
    """The gradient of the mean loss over all of (x, y), as one flat vector."""
    model.train()
    model.zero_grad(set_to_none=False)
    per_sample_loss(model(x), y, task).mean().backward()
    return torch.cat([cast(torch.Tensor, p.grad).reshape(-1) for p in model.parameters()]).detach().clone()
