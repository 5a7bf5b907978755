"""Batched multi-client training: the clients of one host trained in one vectorised computation.

:func:`batched_proximal_train` runs :func:`raysoft.training.proximal_train` for C clients at
once: their parameters are stacked into a [C, d] matrix, each step evaluates every client's
mini-batch with ``torch.func.vmap`` over ``functional_call``, and the optimizer update (the
lean Adam/SGD of :mod:`raysoft.optim`, written here over rows) is applied row-wise. Each client
keeps its own data order (its own random stream), its own optimizer state (step counts,
moments) and its own number of mini-batches: the clients step in lockstep, and a client whose
epoch has fewer batches sits out the extra steps (no gradient, no optimizer step). A partial
last batch is padded and masked, its loss the mean over its real samples. The result equals the
per-client loop up to float rounding (tested).

Lockstep pays for padding: every client of a call is padded to the call's longest epoch. The
clients are therefore trained in buckets (:func:`buckets`), one lockstep computation each, chosen
to minimise a step-time model: a lockstep step costs a fixed overhead (autograd, vmap dispatch,
the optimizer's row updates; ``STEP_OVERHEAD`` sample-parameters) plus the samples it computes
times the parameters. Where a sample is cheap against the overhead (the linear models of the
synthetic workloads) similar clients share one bucket and pay for a little padding; where it is
not (full-batch steps on FPFC's lognormal sizes, which padded every device to the largest one,
8-19x the arithmetic) the buckets follow the sizes. Buckets are formed from the clients' own
sizes, and each client's numbers come from its own data, stream and state, so a client's result
does not depend on which other clients share its call.

It pays where the per-step cost of a small model is Python and dispatch overhead (the linear
models of the synthetic workloads); on a CPU a CNN's arithmetic dominates and batching does not
help (``train.batched_clients: auto`` chooses by model;
docs/performance.md#batched-multi-client-training has the measurements).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from .config import TrainConfig
from .optim import SGD, Adam
from .training import batch_order, per_sample_loss

BATCHED_MODELS = ("linear", "logistic")  # auto: where batching measured faster
# A lockstep step's fixed cost, in units of one sample x one parameter of its variable cost;
# measured, then swept on FPFC's Local baseline (docs/performance.md#batched-multi-client-training).
STEP_OVERHEAD = 1_000_000.0


def can_batch(model: nn.Module) -> str | None:
    """None if ``model`` can be trained batched, else why not (batch norm keeps running
    statistics outside the parameters, which a vmapped functional call cannot update)."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return f"{type(m).__name__} layers"
    return None


def use_batched(cfg_train: TrainConfig, model_name: str, model: nn.Module) -> bool:
    """Whether ``train.batched_clients`` (auto/on/off) batches this model."""
    mode = cfg_train.batched_clients
    if mode == "off" or can_batch(model) is not None:
        return False
    return mode == "on" or model_name in BATCHED_MODELS


_warm = False


def warm_up() -> None:
    """Pay torch.func's first-call cost (about a second) once per process, at start-up rather
    than inside the first round (where it would, e.g., miss a round deadline)."""
    global _warm
    if _warm:
        return
    _warm = True
    from .models import LinearRegression

    model = LinearRegression(2)
    opts = [Adam(LinearRegression(2).parameters(), lr=0.1) for _ in range(2)]
    x, y = torch.zeros(2, 2), torch.zeros(2)
    batched_proximal_train(model, torch.zeros(2, 2), opts, [x, x], [y, y], "regression",
                           TrainConfig(batch_size=1, local_epochs=1), [None, None])


def _stack_state(opts: Sequence[Adam | SGD], d: int, attr: str) -> torch.Tensor:
    rows = []
    for o in opts:
        bufs = getattr(o, attr)
        if any(b is None for b in bufs):  # SGD's lazily created momentum buffer: zero is the same
            rows.append(torch.zeros(d))
        else:
            rows.append(torch.cat([b.reshape(-1) for b in bufs]))
    return torch.stack(rows)


def _unstack_state(opts: Sequence[Adam | SGD], values: torch.Tensor, attr: str, shapes: list[torch.Size]) -> None:
    for o, row in zip(opts, values):
        out, i = [], 0
        for s in shapes:
            n = math.prod(s)
            out.append(row[i:i + n].view(s).clone())
            i += n
        setattr(o, attr, out)


def padded_epoch(n: int, batch_size: int | None) -> int:
    """Samples one epoch of an ``n``-sample client computes: whole batches (one full batch if
    ``batch_size`` is None)."""
    return n if batch_size is None else -(-n // batch_size) * batch_size


def buckets(lengths: Sequence[int], batch_size: int | None, params: int) -> list[list[int]]:
    """Indices of ``lengths`` (padded epoch lengths, in samples) grouped into lockstep buckets
    that minimise the modelled time of an epoch: over the buckets, ``STEP_OVERHEAD / params``
    times the bucket's steps (its longest length over ``batch_size``, or 1 step for full-batch
    training) plus its clients times its longest length (the samples it computes). The best
    grouping is contiguous in the order by length (ties by index); a dynamic programme over
    that order finds it (ties between groupings: the one with the larger last bucket)."""
    order = sorted(range(len(lengths)), key=lambda k: (lengths[k], k))
    if not order:
        return []
    sl = np.array([lengths[i] for i in order], dtype=np.float64)
    per_step = STEP_OVERHEAD / max(1, params)
    steps = np.ones_like(sl) if batch_size is None else np.ceil(sl / batch_size)
    ends = [j + 1 for j in range(len(sl)) if j + 1 == len(sl) or sl[j + 1] > sl[j]]  # equal lengths stay together
    starts = np.array([0] + ends[:-1])
    best = np.zeros(len(ends) + 1)  # best[e]: cost of the clients before ends[e - 1]
    cut = np.zeros(len(ends), dtype=np.int64)
    for e, j in enumerate(ends):
        cost = best[:e + 1] + per_step * steps[j - 1] + (j - starts[:e + 1]) * sl[j - 1]
        cut[e] = int(np.argmin(cost))
        best[e + 1] = cost[cut[e]]
    out: list[list[int]] = []
    e = len(ends) - 1
    while e >= 0:
        s0 = int(starts[cut[e]])
        out.append(order[s0:ends[e]])
        e = cut[e] - 1
    return out[::-1]


def padding_ratio(ns: Sequence[int], batch_size: int | None, params: int) -> float:
    """Samples computed by bucketed lockstep training of a ``params``-parameter model over the
    samples of the clients' padded epochs (1.0: no padding beyond each client's own last batch)."""
    lengths = [padded_epoch(n, batch_size) for n in ns]
    done = sum(len(g) * max(lengths[i] for i in g) for g in buckets(lengths, batch_size, params))
    return done / max(1, sum(lengths))


def batched_proximal_train(
    model: nn.Module,
    start: torch.Tensor,
    opts: Sequence[Adam | SGD],
    xs: Sequence[torch.Tensor],
    ys: Sequence[torch.Tensor],
    task: str,
    cfg: TrainConfig,
    rngs: Sequence[np.random.Generator | None],
    pull_scale: torch.Tensor | None = None,
    pull_target: torch.Tensor | None = None,
) -> torch.Tensor:
    """Train C clients from ``start`` ([C, d]) and return their parameters ([C, d]).

    ``model`` is a scratch module giving the architecture; ``opts`` are the clients' lean
    optimizers (their state is read and written back; all of one kind and settings);
    ``pull_scale`` [C] and ``pull_target`` [C, d] add ``pull_scale * w - pull_target`` to each
    client's gradient, as in :func:`~raysoft.training.proximal_train`. The clients are trained
    in lockstep within each of :func:`buckets` of their padded epoch lengths.
    """
    groups = buckets([padded_epoch(int(y.shape[0]), cfg.batch_size) for y in ys], cfg.batch_size, start.shape[1])
    if len(groups) == 1:
        return _lockstep_train(model, start, opts, xs, ys, task, cfg, rngs, pull_scale, pull_target)
    w = torch.empty_like(start)
    for g in groups:
        rows = torch.tensor(g)
        w[rows] = _lockstep_train(
            model, start[rows], [opts[i] for i in g], [xs[i] for i in g], [ys[i] for i in g], task, cfg,
            [rngs[i] for i in g], None if pull_scale is None else pull_scale[rows],
            None if pull_target is None else pull_target[rows],
        )
    return w


def _lockstep_train(
    model: nn.Module,
    start: torch.Tensor,
    opts: Sequence[Adam | SGD],
    xs: Sequence[torch.Tensor],
    ys: Sequence[torch.Tensor],
    task: str,
    cfg: TrainConfig,
    rngs: Sequence[np.random.Generator | None],
    pull_scale: torch.Tensor | None,
    pull_target: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`batched_proximal_train` of one bucket: every client padded to the longest epoch."""
    num, d = start.shape
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    sizes = [math.prod(s) for s in shapes]
    if d != sum(sizes):
        raise ValueError(f"batched_proximal_train: start has {d} parameters, the model {sum(sizes)}")
    buffers = {n: b for n, b in model.named_buffers()}
    adam = isinstance(opts[0], Adam)
    o0 = opts[0]

    def forward(flat: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
        params = {n: t.view(s) for n, t, s in zip(names, torch.split(flat, sizes), shapes)}
        return functional_call(model, (params, buffers), (xb,))

    batched_forward = vmap(forward)

    def grads_of(w: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, mb: torch.Tensor) -> torch.Tensor:
        """Each client's gradient of its masked mean batch loss: the clients are independent,
        so one backward pass of the sum of their losses gives every row's gradient."""
        w = w.detach().requires_grad_(True)
        out = batched_forward(w, xb)
        losses = per_sample_loss(out.flatten(0, 1), yb.flatten(), task).view(mb.shape)
        ((losses * mb).sum(dim=1) / mb.sum(dim=1).clamp_min(1.0)).sum().backward()
        return w.grad

    w = start.clone()
    if adam:
        m, v = _stack_state(opts, d, "exp_avg"), _stack_state(opts, d, "exp_avg_sq")
        steps = torch.tensor([o.steps for o in opts], dtype=torch.float64)
        b1, b2 = o0.betas
    else:
        buf = _stack_state(opts, d, "buffers")
    ns = [int(y.shape[0]) for y in ys]
    batch = cfg.batch_size or max(ns)
    x_all, y_all = torch.cat(list(xs)), torch.cat(list(ys))
    offsets = np.concatenate([[0], np.cumsum(ns)[:-1]])
    model.train()
    for epoch in range(cfg.local_epochs):
        steps_per_epoch = max(-(-n // batch) for n in ns)
        # every client's sample order of this epoch, padded to whole batches (padding masked out)
        idx = np.zeros((num, steps_per_epoch * batch), dtype=np.int64)
        mask = np.zeros((num, steps_per_epoch * batch), dtype=np.float32)
        for c in range(num):
            order = offsets[c] + batch_order(ns[c], epoch, cfg, rngs[c])
            idx[c, :ns[c]], idx[c, ns[c]:], mask[c, :ns[c]] = order, order[0], 1.0
        idx_t, mask_t = torch.from_numpy(idx), torch.from_numpy(mask)
        for j in range(steps_per_epoch):
            ti, mb = idx_t[:, j * batch:(j + 1) * batch], mask_t[:, j * batch:(j + 1) * batch]
            act = mb[:, 0] > 0
            g = grads_of(w, x_all[ti], y_all[ti], mb)
            with torch.no_grad():
                if pull_scale is not None:
                    g = g + pull_scale[:, None] * w
                if pull_target is not None:
                    g = g - pull_target
                every = bool(act.all())
                a = slice(None) if every else act.nonzero().squeeze(1)  # the clients that step
                wa, ga = (w, g) if every else (w[a], g[a])
                if o0.weight_decay:
                    ga = ga + o0.weight_decay * wa
                if adam:
                    steps[a] += 1
                    sa = steps[a]
                    bc1 = (1 - b1**sa).float()[:, None]
                    bc2_sqrt = torch.sqrt(1 - b2**sa).float()[:, None]
                    ma = m[a].lerp(ga, 1 - b1)
                    va = v[a].mul(b2).addcmul(ga, ga, value=1 - b2)
                    m[a], v[a] = ma, va
                    w[a] = wa - (o0.lr / bc1) * ma / ((va.sqrt() / bc2_sqrt) + o0.eps)
                else:
                    if o0.momentum:
                        ba = buf[a].mul(o0.momentum).add(ga)
                        buf[a] = ba
                        ga = ba
                    w[a] = wa - o0.lr * ga
    if adam:
        _unstack_state(opts, m, "exp_avg", shapes)
        _unstack_state(opts, v, "exp_avg_sq", shapes)
        for o, s in zip(opts, steps.tolist()):
            o.steps = int(s)
    elif o0.momentum:
        _unstack_state(opts, buf, "buffers", shapes)
    return w
