"""Batched multi-client training: the clients of one host trained in one vectorised computation.

:func:`batched_proximal_train` runs :func:`raysoft.training.proximal_train` for C clients at
once: their parameters are stacked into a [C, d] matrix, each step evaluates the clients'
mini-batches with ``torch.func.vmap`` over ``functional_call`` (or :func:`stacked_forward`),
and the optimizer update (the
lean Adam/SGD of :mod:`raysoft.optim`, written here over rows) is applied row-wise. Each client
keeps its own data order (its own random stream), its own optimizer state (step counts,
moments) and its own number of mini-batches: the clients step in lockstep, and a client whose
epoch has fewer batches sits out the extra steps (no gradient, no optimizer step). A partial
last batch is padded and masked, its loss the mean over its real samples. The result equals the
per-client loop up to float rounding (tested).

Within a lockstep computation the rows are ordered longest epoch first, so the clients still in
their epoch at a step are a prefix of the rows, and a step computes only them: with mini-batches
no client pays for another's longer epoch. A full batch is one step of every client, padded to
the longest, so full-batch clients are trained in buckets (:func:`buckets`), one lockstep
computation each, chosen to minimise a step-time model: a step costs a fixed overhead
(autograd, dispatch, the optimizer's row updates; ``STEP_OVERHEAD`` sample-parameters) plus the
samples it computes times the parameters. Similar clients share a bucket and pay for a little
padding; on FPFC's lognormal sizes (one call padded every device to the largest one: 8-19x the
arithmetic) the buckets follow the sizes. Each client's numbers come from its own data, stream
and state, and each row's products are its own, so a client's result does not depend on which
other clients share its call or where its row sits.

For the linear and logistic models the stacked forward pass is written as batched matrix
products (:func:`stacked_forward`), the same products ``vmap`` makes, without its dispatch.

It pays where the per-step cost of a small model is Python and dispatch overhead (the linear
models of the synthetic workloads); on a CPU a CNN's arithmetic dominates and batching does not
help (``train.batched_clients: auto`` chooses by model;
docs/performance.md#batched-multi-client-training has the measurements).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias, cast

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from .config import TrainConfig
from .optim import SGD, Adam, adam_update_
from .training import batch_order, per_sample_loss

BATCHED_MODELS = ("linear", "logistic")  # auto: where batching measured faster
# A lockstep step's fixed cost, in units of one sample x one parameter of its variable cost;
# measured, then swept on FPFC's Local baseline (docs/performance.md#batched-multi-client-training).
STEP_OVERHEAD = 1_000_000.0

# f(w [C, d], x [C, B, ...]) -> [C, B, ...]: C stacked copies of a model run at once
StackedForward: TypeAlias = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# grads_of(w, xb, yb, wb) -> each row's gradient [rows, d]
BatchedGrads: TypeAlias = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def can_batch(model: nn.Module) -> str | None:
    """None if ``model`` can be trained batched, else why not (batch norm keeps running
    statistics outside the parameters, which a vmapped functional call cannot update; recurrent
    layers have no vmap rule)."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return f"{type(m).__name__} layers"
        if isinstance(m, nn.RNNBase):  # torch.func.vmap has no batching rule for aten::lstm / gru / rnn
            return f"{type(m).__name__} layers"
    return None


def use_batched(cfg_train: TrainConfig, model_name: str, model: nn.Module,
                device: torch.device | None = None) -> bool:
    """Whether ``train.batched_clients`` (auto/on/off) batches this model on ``device`` (auto:
    every model it can batch on a GPU, where one small client's steps leave the GPU waiting on
    kernel launches; on the CPU the models of ``BATCHED_MODELS``)."""
    mode = cfg_train.batched_clients
    if mode == "off" or can_batch(model) is not None:
        return False
    gpu = device is not None and device.type == "cuda"
    if gpu and cfg_train.batch_size is None:  # a full batch's width is the largest client's: one shape per
        return False  # packing, so on a GPU (kernels chosen by shape) full-batch clients train one by one
    return mode == "on" or model_name in BATCHED_MODELS or gpu


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
                           TrainConfig.model_validate({"batch_size": 1, "local_epochs": 1}), [None, None])


def _stack_state(opts: Sequence[Adam | SGD], d: int, attr: str, device: torch.device) -> torch.Tensor:
    rows = []
    for o in opts:
        bufs = getattr(o, attr)
        if any(b is None for b in bufs):  # SGD's lazily created momentum buffer: zero is the same
            rows.append(torch.zeros(d, device=device))
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


def stacked_forward(model: nn.Module) -> StackedForward | None:
    """The forward pass of C stacked copies of ``model`` written as batched matrix products,
    ``f(w [C, d], x [C, B, ...]) -> [C, B, ...]``, for the models where that is known (the linear
    and logistic models; None for others, which go through ``vmap`` of ``functional_call``). It
    computes the same products as the vmapped ``nn.Linear`` (``x @ W^T`` as a ``bmm`` with the
    transposed weights; bias by ``baddbmm``), bit for bit (tested), without vmap's and
    functional_call's per-call dispatch, which dominated a linear model's step."""
    from .models import LinearRegression, Logistic

    if type(model) is LinearRegression:
        din = model.linear.in_features

        def linear(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return torch.bmm(x, w.view(-1, 1, din).transpose(1, 2)).squeeze(-1)

        return linear
    if type(model) is Logistic:
        k, din = model.linear.out_features, model.linear.in_features

        def logistic(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            weight, bias = w[:, :k * din].view(-1, k, din), w[:, k * din:]
            return torch.baddbmm(bias[:, None, :], x.flatten(2), weight.transpose(1, 2))

        return logistic
    return None


def padded_epoch(n: int, batch_size: int | None) -> int:
    """Samples one epoch of an ``n``-sample client computes: whole batches (one full batch if
    ``batch_size`` is None)."""
    return n if batch_size is None else -(-n // batch_size) * batch_size


def bucket_samples(lengths: Sequence[int], batch_size: int | None) -> int:
    """Samples one lockstep computation of clients with these padded epoch lengths computes an
    epoch. Its rows are ordered longest first and a step computes only the clients still in
    their epoch, so with mini-batches that is each client's own padded epoch; a full batch (one
    step, every client) pads every client to the longest."""
    return sum(lengths) if batch_size is not None else len(lengths) * max(lengths, default=0)


def buckets(lengths: Sequence[int], batch_size: int | None, params: int) -> list[list[int]]:
    """Indices of ``lengths`` (padded epoch lengths, in samples) grouped into lockstep buckets
    that minimise the modelled time of an epoch: over the buckets, ``STEP_OVERHEAD / params``
    times the bucket's steps (its longest length over ``batch_size``, or 1 step for full-batch
    training) plus the samples it computes (:func:`bucket_samples`). With mini-batches those are
    the same in any grouping, so one bucket is cheapest; with full batches the best grouping is
    contiguous in the order by length (ties by index), and a dynamic programme over that order
    finds it (ties between groupings: the one with the larger last bucket)."""
    order = sorted(range(len(lengths)), key=lambda k: (lengths[k], k))
    if not order:
        return []
    if batch_size is not None:
        return [order]
    sl = np.array([lengths[i] for i in order], dtype=np.float64)
    per_step = STEP_OVERHEAD / max(1, params)
    ends = [j + 1 for j in range(len(sl)) if j + 1 == len(sl) or sl[j + 1] > sl[j]]  # equal lengths stay together
    starts = np.array([0] + ends[:-1])
    best = np.zeros(len(ends) + 1)  # best[e]: cost of the clients before ends[e - 1]
    cut = np.zeros(len(ends), dtype=np.int64)
    for e, j in enumerate(ends):
        cost = best[:e + 1] + per_step + (j - starts[:e + 1]) * sl[j - 1]
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
    done = sum(bucket_samples([lengths[i] for i in g], batch_size) for g in buckets(lengths, batch_size, params))
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
    rows: int | None = None,
) -> torch.Tensor:
    """Train C clients from ``start`` ([C, d]) and return their parameters ([C, d]).

    ``model`` is a scratch module giving the architecture; ``opts`` are the clients' lean
    optimizers (their state is read and written back; all of one kind and settings);
    ``pull_scale`` [C] and ``pull_target`` [C, d] add ``pull_scale * w - pull_target`` to each
    client's gradient, as in :func:`~raysoft.training.proximal_train`. The clients are trained
    in lockstep within each of :func:`buckets` of their padded epoch lengths.

    ``rows`` (a GPU's fixed shape): the clients are trained in chunks of exactly ``rows``, a
    last chunk padded with throwaway rows, every step computing every row (a client whose epoch
    has ended, or a padding row, takes no step): each kernel then has the same shape whatever
    the number of clients in the call, so a client's numbers do not depend on which clients share
    its actor, where a GPU library would choose its kernels by shape. Only with mini-batches
    (a full batch's width is the chunk's largest client); full-batch training uses the buckets.
    """
    clients = _Clients(start, opts, xs, ys, rngs, pull_scale, pull_target)
    if rows is not None and cfg.batch_size is not None:
        w = torch.empty_like(start)
        for first in range(0, start.shape[0], rows):
            chunk = list(range(first, min(first + rows, start.shape[0])))
            trained = _lockstep_train(model, clients.take(chunk).padded(rows), task, cfg, fixed=True)
            w[first:first + len(chunk)] = trained[:len(chunk)]
        return w
    groups = buckets([padded_epoch(int(y.shape[0]), cfg.batch_size) for y in ys], cfg.batch_size, start.shape[1])
    if len(groups) == 1:
        return _lockstep_train(model, clients, task, cfg)
    w = torch.empty_like(start)
    for g in groups:
        w[torch.tensor(g, device=start.device)] = _lockstep_train(model, clients.take(g), task, cfg)
    return w


@dataclass(frozen=True)
class _Clients:
    """The inputs of a lockstep call, one row (or list entry) a client."""

    start: torch.Tensor
    opts: Sequence[Adam | SGD]
    xs: Sequence[torch.Tensor]
    ys: Sequence[torch.Tensor]
    rngs: Sequence[np.random.Generator | None]
    pull_scale: torch.Tensor | None
    pull_target: torch.Tensor | None

    def take(self, rows: Sequence[int]) -> _Clients:
        """These clients' rows, in the order given."""
        r = torch.tensor(list(rows), device=self.start.device)
        return _Clients(
            self.start[r], [self.opts[i] for i in rows], [self.xs[i] for i in rows], [self.ys[i] for i in rows],
            [self.rngs[i] for i in rows], None if self.pull_scale is None else self.pull_scale[r],
            None if self.pull_target is None else self.pull_target[r],
        )

    def padded(self, rows: int) -> _Clients:
        """These clients and throwaway rows up to ``rows``: copies of the last client with an
        optimizer of their own (a shallow copy, whose buffers the call replaces, never writes
        into) and a random stream of their own (the client's is not advanced twice)."""
        extra = rows - self.start.shape[0]
        if extra <= 0:
            return self
        last = self.start.shape[0] - 1

        def more(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else torch.cat([t, t[last:].expand(extra, *t.shape[1:])])

        return _Clients(
            cast(torch.Tensor, more(self.start)), [*self.opts, *(copy.copy(self.opts[last]) for _ in range(extra))],
            [*self.xs, *[self.xs[last]] * extra], [*self.ys, *[self.ys[last]] * extra],
            [*self.rngs, *(np.random.default_rng(0) for _ in range(extra))], more(self.pull_scale),
            more(self.pull_target),
        )


def _lockstep_train(model: nn.Module, clients: _Clients, task: str, cfg: TrainConfig,
                    fixed: bool = False) -> torch.Tensor:
    """:func:`batched_proximal_train` of one bucket: the clients in lockstep, a step computing those
    still in their epoch (``fixed``: every row, the others' updates masked out)."""
    num, d = clients.start.shape
    device = clients.start.device
    grads_of = _batched_grads(model, task, d)
    # rows ordered by epoch length, longest first (ties by position): the clients that step at
    # step j (whose epoch has more than j batches) are then a prefix of the rows, computed as a
    # view, and a client whose epoch has ended costs nothing (no padding beyond its last batch)
    client_sizes = [int(y.shape[0]) for y in clients.ys]
    batch = cfg.batch_size or max(client_sizes)
    client_steps = [-(-n // batch) for n in client_sizes]  # each client's steps per epoch, in call order
    perm = sorted(range(num), key=lambda c: (-client_steps[c], c))
    reordered = perm != list(range(num))
    if reordered:
        clients = clients.take(perm)
    # the same, in row order (longest epoch first)
    row_sizes, row_steps = [client_sizes[c] for c in perm], [client_steps[c] for c in perm]
    steps_per_epoch = row_steps[0]
    active = [sum(1 for s in row_steps if s > j) for j in range(steps_per_epoch)]  # clients stepping at step j
    stepping = (torch.arange(num, device=device)[None, :] < torch.tensor(active, device=device)[:, None]
                if fixed else None)  # fixed: which rows step at step j (the others are masked out)
    w = clients.start.clone()
    opt = _LockstepOptimizer(clients.opts, d, row_steps, cfg.local_epochs, device)
    x_all, y_all = torch.cat(list(clients.xs)), torch.cat(list(clients.ys))
    offsets = np.concatenate([[0], np.cumsum(row_sizes)[:-1]])
    model.train()
    for epoch in range(cfg.local_epochs):
        x_ep, y_ep, weight = _epoch_batches(x_all, y_all, offsets, row_sizes, clients.rngs, epoch, cfg, batch,
                                            steps_per_epoch)
        for j in range(steps_per_epoch):
            a = slice(0, num if fixed else active[j])  # the clients computed (fixed: all, the rest masked)
            cols = slice(j * batch, (j + 1) * batch)
            wa = w[a]
            g = grads_of(wa, x_ep[a, cols], y_ep[a, cols], weight[a, cols])
            with torch.no_grad():
                if clients.pull_scale is not None:
                    g = g + clients.pull_scale[a, None] * wa
                if clients.pull_target is not None:
                    g = g - clients.pull_target[a]
                opt.step(w, a, g, epoch, j, None if stepping is None else stepping[j][:, None])
    opt.save([p.shape for _, p in model.named_parameters()])
    if not reordered:
        return w
    out = torch.empty_like(w)
    out[torch.tensor(perm, device=device)] = w
    return out


def _batched_grads(model: nn.Module, task: str, d: int) -> BatchedGrads:
    """``grads_of(w, xb, yb, wb)``: each row's gradient of its client's masked mean batch loss,
    ``model`` run on every row's flat parameters ``w`` [rows, d] at once."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    sizes = [math.prod(s) for s in shapes]
    if d != sum(sizes):
        raise ValueError(f"batched_proximal_train: start has {d} parameters, the model {sum(sizes)}")
    buffers = {n: b for n, b in model.named_buffers()}

    def forward(flat: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
        params = {n: t.view(s) for n, t, s in zip(names, torch.split(flat, sizes), shapes)}
        return functional_call(model, (params, buffers), (xb,))

    batched_forward = stacked_forward(model) or vmap(forward)

    def grads_of(w: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, wb: torch.Tensor) -> torch.Tensor:
        """Each client's gradient of its masked mean batch loss (``wb``: each sample's weight,
        1 / the batch's real samples, 0 for padding): the clients are independent, so one
        backward pass of the sum of their losses gives every row's gradient."""
        w = w.detach().requires_grad_(True)
        out = batched_forward(w, xb)
        (per_sample_loss(out.flatten(0, 1), yb.flatten(), task).view(wb.shape) * wb).sum().backward()
        return cast(torch.Tensor, w.grad)

    return grads_of


def _epoch_batches(x_all: torch.Tensor, y_all: torch.Tensor, offsets: np.ndarray, ns: list[int],
                   rngs: Sequence[np.random.Generator | None], epoch: int, cfg: TrainConfig, batch: int,
                   steps_per_epoch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The epoch's batches of every client, gathered once: (x, y, each sample's share of its
    batch's mean), [clients, steps_per_epoch * batch, ...], every client's sample order of this
    epoch padded to whole batches (the padding's share 0)."""
    num, device = len(ns), x_all.device
    idx = np.zeros((num, steps_per_epoch * batch), dtype=np.int64)
    mask = np.zeros((num, steps_per_epoch * batch), dtype=np.float32)
    for c in range(num):
        order = offsets[c] + batch_order(ns[c], epoch, cfg, rngs[c])
        idx[c, :ns[c]], idx[c, ns[c]:], mask[c, :ns[c]] = order, order[0], 1.0
    idx_t, mask_t = torch.from_numpy(idx).to(device), torch.from_numpy(mask).to(device)
    real = mask_t.view(num, steps_per_epoch, batch).sum(dim=2, keepdim=True).clamp_min(1.0)
    weight = (mask_t.view(num, steps_per_epoch, batch) / real).view(num, -1)  # a sample's share of its batch's mean
    return x_all[idx_t], y_all[idx_t], weight


class _LockstepOptimizer:
    """Every client's optimizer (Adam, or SGD with or without momentum; all with the
    hyperparameters of the first, ``opts[0]``) as stacked state: a step updates rows in place,
    :meth:`save` hands each client's state back to its optimizer. Adam's step is
    :func:`~raysoft.optim.adam_update_`, the one each client's :class:`~raysoft.optim.Adam` takes."""

    def __init__(self, opts: Sequence[Adam | SGD], d: int, row_steps: list[int], epochs: int,
                 device: torch.device) -> None:
        self.opts, self.row_steps, self.epochs = opts, row_steps, epochs
        first = opts[0]  # every client's alike
        self.lr, self.weight_decay = first.lr, first.weight_decay
        none = torch.empty(0, device=device)  # the state the other optimizer keeps
        self.m, self.v, self.buf, self.step_sizes, self.bc2_sqrts = none, none, none, none, none
        self.betas, self.eps, self.momentum = (0.9, 0.999), 0.0, 0.0
        self.adam = isinstance(first, Adam)
        if not isinstance(first, Adam):
            self.momentum = first.momentum
            self.buf = _stack_state(opts, d, "buffers", device)
            return
        self.betas, self.eps = first.betas, first.eps
        self.m, self.v = _stack_state(opts, d, "exp_avg", device), _stack_state(opts, d, "exp_avg_sq", device)
        b1, b2 = first.betas
        # Adam's bias corrections of every step of the call, made at once: at step j of epoch e
        # client c takes its (e * steps_c + j + 1)-th step of the call (when j < steps_c)
        e_j = (
            np.arange(epochs)[:, None, None] * np.asarray(row_steps)[None, None, :]
            + np.arange(row_steps[0])[None, :, None]
        )
        steps = [cast(Adam, o).steps for o in opts]
        # each client's Adam step count at every step of the call: [epochs, steps, C]
        step_counts = torch.from_numpy(np.asarray(steps, dtype=np.float64)[None, None, :] + e_j + 1)
        self.step_sizes = (first.lr / (1 - b1**step_counts).float()[..., None]).to(device)  # lr / bc1: [.., C, 1]
        self.bc2_sqrts = torch.sqrt(1 - b2**step_counts).float()[..., None].to(device)

    def step(self, w: torch.Tensor, a: slice, g: torch.Tensor, epoch: int, j: int,
             stepping: torch.Tensor | None) -> None:
        """Step ``j`` of ``epoch`` of the rows ``a`` with their gradients ``g``, in place on ``w``
        (``stepping``: every row computed, only those True [rows, 1] updated)."""
        wa = w[a]
        ga = g + self.weight_decay * wa if self.weight_decay else g
        if stepping is not None and self.adam:
            self._masked_adam(w, ga, stepping, self.step_sizes[epoch, j], self.bc2_sqrts[epoch, j])
        elif stepping is not None:
            _masked_sgd(w, self.buf, ga, stepping, self.lr, self.momentum)
        elif self.adam:  # in place on the rows' views
            adam_update_(wa, self.m[a], self.v[a], ga, self.betas, self.eps, self.step_sizes[epoch, j, a],
                         self.bc2_sqrts[epoch, j, a])
        else:
            if self.momentum:
                ga = self.buf[a].mul_(self.momentum).add_(ga)
            wa.sub_(self.lr * ga)

    def _masked_adam(self, w: torch.Tensor, g: torch.Tensor, step: torch.Tensor, step_size: torch.Tensor,
                     bc2_sqrt: torch.Tensor) -> None:
        """One Adam step of every row, kept only where ``step`` ([rows, 1]) is True: the step
        (:func:`~raysoft.optim.adam_update_`) made on copies, the other rows' parameters and
        moments left as they were (a row that steps gets the unmasked step's numbers).
        ``step_size``: each row's lr / bias correction 1; ``bc2_sqrt``: the square root of its
        bias correction 2."""
        m, v, new_w = self.m.clone(), self.v.clone(), w.clone()
        adam_update_(new_w, m, v, g, self.betas, self.eps, step_size, bc2_sqrt)
        self.m.copy_(torch.where(step, m, self.m))
        self.v.copy_(torch.where(step, v, self.v))
        w.copy_(torch.where(step, new_w, w))

    def save(self, shapes: list[torch.Size]) -> None:
        """Each client's moments (Adam) or momentum buffer back into its optimizer, and Adam's
        step counts advanced by the call's steps."""
        if self.adam:
            _unstack_state(self.opts, self.m, "exp_avg", shapes)
            _unstack_state(self.opts, self.v, "exp_avg_sq", shapes)
            for o, n in zip(self.opts, self.row_steps):
                cast(Adam, o).steps += self.epochs * n
        elif self.momentum:
            _unstack_state(self.opts, self.buf, "buffers", shapes)


def _masked_sgd(w: torch.Tensor, buf: torch.Tensor, g: torch.Tensor, step: torch.Tensor, lr: float,
                momentum: float) -> None:
    """One SGD step (with ``momentum`` where it is not 0, its buffer ``buf``) of every row, in
    place, kept only where ``step`` ([rows, 1]) is True, as :meth:`_LockstepOptimizer._masked_adam`."""
    if momentum:
        buf.copy_(torch.where(step, buf * momentum + g, buf))
        g = buf
    w.copy_(torch.where(step, w - lr * g, w))
