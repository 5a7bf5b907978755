"""The bare loop: FedAvg and FedSoft as plain Python loops over the selected clients, one
process, ``torch.optim`` - the floor of a naive implementation of the same maths (the pure
FedSoft sub-steps, the same client selection streams, the same local steps and averaging).
``device="cuda"``: the models and every client's data on the GPU, each round's time taken after
``torch.cuda.synchronize()``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..catalog import CNNModel
from ..config import parse_config


def sync(device: str) -> None:
    """Wait for the device's queued work (a GPU's kernels run asynchronously), so that a time
    taken next counts it."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _bare_setup(raw: Mapping[str, object], device: str = "cpu"):
    import torch

    from ..algorithms.base import ServerContext
    from ..data import Federation
    from ..models import build_model

    cfg = parse_config(raw)
    fed = Federation(cfg.data, cfg.seed)
    ctx = ServerContext(cfg=cfg, sizes=fed.sizes, info=fed.info)
    data = [fed.client_data(k) for k in range(fed.num_clients)]
    torch.set_num_threads(2)
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the bare loop on cuda: torch finds no CUDA here")
    return cfg, fed, ctx, data, build_model


def _sgd_epochs(model, opt, x, y, task, cfg, rng) -> None:
    """The plain local loop: shuffled mini-batches, mean loss, backward, step."""
    import torch
    import torch.nn.functional as F

    model.train()
    for _ in range(cfg.train.local_epochs):
        order = rng.permutation(len(y)) if cfg.train.shuffle else np.arange(len(y))
        order_t = torch.as_tensor(order, device=x.device)
        for i in range(0, len(y), cfg.train.batch_size):
            idx = order_t[i:i + cfg.train.batch_size]
            out = model(x[idx])
            loss = F.mse_loss(out, y[idx]) if task == "regression" else F.cross_entropy(out, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()


def bare_fedavg(raw: Mapping[str, object], export: Path | None = None, device: str = "cpu") -> dict[str, object]:
    """FedAvg as a plain loop on ``device``; ``export`` writes its clients, selections and
    initial model for Flower and pfl (``benchmarks/flower.py`` and ``benchmarks/pfl/`` say what
    the file holds)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    from ..algorithms.common import uniform_selection
    from ..rng import numpy_rng, seed_sequence

    start = time.monotonic()
    cfg, fed, ctx, data, build_model = _bare_setup(raw, device)
    a, n = cfg.algorithm, fed.sizes
    glob = ctx.new_model("center", 0)
    selections = [uniform_selection(fed.num_clients, a.clients_per_round, numpy_rng(cfg.seed, "select", t))
                  for t in range(a.rounds)]
    holdouts = [fed.holdout(s) for s in range(fed.num_distributions)]
    if export is not None:
        cnn_cfg = cfg.model
        if not isinstance(cnn_cfg, CNNModel):
            raise ValueError(f"export: the exported loop is the cnn's, not model {cnn_cfg.name!r}'s")
        arrays: dict[str, Any] = {f"init_{i}": p.detach().numpy() for i, p in enumerate(glob.parameters())}
        for k, d in enumerate(data):
            arrays[f"x_{k}"], arrays[f"y_{k}"] = d.x.numpy(), d.y.numpy()
        arrays.update(
            num_clients=fed.num_clients, selection=np.array(selections, dtype=np.int64),
            x_test=torch.cat([h[0] for h in holdouts]).numpy(), y_test=torch.cat([h[1] for h in holdouts]).numpy(),
            lr=cfg.train.lr, momentum=cfg.train.momentum, batch_size=cfg.train.batch_size,
            local_epochs=cfg.train.local_epochs, seed=cfg.seed, channels=np.array(cnn_cfg.channels),
            hidden=cnn_cfg.hidden, classes=fed.info.num_outputs,
            # for pfl: which loop this is, and the batch orders' stream (client k, round t):
            # np.random.default_rng(SeedSequence([*shuffle_entropy, k, t])), as numpy_rng's
            algorithm="fedavg", shuffle=cfg.train.shuffle, shuffle_entropy=_entropy(seed_sequence(cfg.seed, "shuffle")),
        )
        np.savez(export, **arrays)
    glob = glob.to(device)
    xs = [d.x.to(device) for d in data]
    ys = [d.y.to(device) for d in data]
    holdouts = [(x.to(device), y.to(device)) for x, y in holdouts]
    local = ctx.new_model("center", 0).to(device)
    times, stamps = [], []
    sync(device)
    for t, sel in enumerate(selections):
        t0 = time.monotonic()
        g = parameters_to_vector(glob.parameters()).detach().clone()
        acc = torch.zeros_like(g)
        for k in sel:
            vector_to_parameters(g.clone(), local.parameters())
            opt = torch.optim.SGD(local.parameters(), lr=cfg.train.lr, momentum=cfg.train.momentum)
            _sgd_epochs(local, opt, xs[k], ys[k], fed.info.task, cfg, numpy_rng(cfg.seed, "shuffle", k, t))
            acc += float(n[k]) * parameters_to_vector(local.parameters()).detach()
        vector_to_parameters(acc / float(sum(n[k] for k in sel)), glob.parameters())
        sync(device)
        stamps.append((t0, time.monotonic()))
        times.append(stamps[-1][1] - t0)
    glob.eval()
    with torch.no_grad():
        outs = [(glob(x), y) for x, y in holdouts]
        accs = [float((out.argmax(-1) == y).float().mean()) for out, y in outs]
        # the pooled holdouts' mean cross-entropy: a continuous measure of the final model, for
        # comparing two runs of the same steps (an accuracy near chance flips with float rounding)
        loss = sum(float(F.cross_entropy(out, y, reduction="sum")) for out, y in outs) / sum(len(y) for _, y in outs)
    return {"sec_per_round_all": times, "updates": [len(s) for s in selections], "quality": float(np.mean(accs)),
            "quality_metric": "accuracy", "test_loss": loss, "total_s": time.monotonic() - start,
            "timed_window": timed_window(stamps)}


def timed_window(stamps: list[tuple[float, float]]) -> tuple[float, float] | None:
    """The time.monotonic() span of the timed rounds (after the warm-up round) of rounds that
    ran over ``stamps`` (start, end); all of them if there is one; None if none ran."""
    if not stamps:
        return None
    timed = stamps[1:] or stamps
    return timed[0][0], timed[-1][1]


def _entropy(seq: np.random.SeedSequence) -> np.ndarray:
    """A seed sequence's entropy as int64s (its parts are below 2**63): the stream's prefix,
    to which a script appends the stream's indices."""
    return np.array(seq.entropy, dtype=np.int64)


def bare_fedsoft(raw: Mapping[str, object], export: Path | None = None, device: str = "cpu") -> dict[str, object]:
    """FedSoft (Algorithm 1) as a plain loop over clients on ``device``, with FedSoft's pure sub-steps;
    ``export`` writes its clients, initial models, hyperparameters and random streams for pfl
    (``benchmarks/pfl/__init__.py`` says what the file holds)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    from ..algorithms.fedsoft import importance_weights, select_clients, selection_probabilities
    from ..rng import numpy_rng, seed_sequence

    start = time.monotonic()
    cfg, fed, ctx, data, build_model = _bare_setup(raw, device)
    a, lam = cfg.algorithm, cfg.algorithm.prox_weight
    S, N = int(a.num_centers or fed.num_distributions), fed.num_clients
    centers = torch.stack([parameters_to_vector(ctx.new_model("center", s).parameters()).detach() for s in range(S)])
    models = [ctx.new_model("client_init") for _ in range(N)]
    opts = [torch.optim.Adam(m.parameters(), lr=cfg.train.lr) for m in models]
    scratch = ctx.new_model("client_init")
    if export is not None:
        arrays: dict[str, Any] = {f"center_{s}": centers[s].numpy() for s in range(S)}
        arrays["client_init"] = parameters_to_vector(models[0].parameters()).detach().numpy()
        for k, d in enumerate(data):
            arrays[f"x_{k}"], arrays[f"y_{k}"] = d.x.numpy(), d.y.numpy()
        for s in range(fed.num_distributions):
            x, y = fed.holdout(s)
            arrays[f"x_test_{s}"], arrays[f"y_test_{s}"] = x.numpy(), y.numpy()
        arrays.update(
            algorithm="fedsoft", num_clients=N, num_centers=S, num_distributions=fed.num_distributions,
            sizes=np.asarray(fed.sizes, dtype=np.int64), dim=fed.info.input_dim, rounds=a.rounds,
            clients_per_round=a.clients_per_round, estimation_interval=a.estimation_interval, sigma=a.sigma,
            prox_weight=lam, lr=cfg.train.lr, batch_size=cfg.train.batch_size, local_epochs=cfg.train.local_epochs,
            seed=cfg.seed,
            # the streams of round t's selection and of client k's batch orders in round t:
            # np.random.default_rng(SeedSequence([*select_entropy, t])), ([*shuffle_entropy, k, t])
            select_entropy=_entropy(seed_sequence(cfg.seed, "select")),
            shuffle_entropy=_entropy(seed_sequence(cfg.seed, "shuffle")),
        )
        np.savez(export, **arrays)
    centers = centers.to(device)
    models = [m.to(device) for m in models]  # in place: the optimizers keep their parameters
    scratch = scratch.to(device)
    xs = [d.x.to(device) for d in data]
    ys = [d.y.to(device) for d in data]
    u = np.full((N, S), 1.0 / S)
    times, updates, stamps = [], [], []
    sync(device)
    for t in range(a.rounds):
        t0 = time.monotonic()
        if t % a.estimation_interval == 0:
            with torch.no_grad():
                for k in range(N):
                    losses = []
                    for s in range(S):
                        vector_to_parameters(centers[s].clone(), scratch.parameters())
                        losses.append(((scratch(xs[k]) - ys[k]) ** 2).cpu().numpy())
                    u[k] = importance_weights(np.stack(losses), a.sigma)
        selected = select_clients(selection_probabilities(u, fed.sizes), a.clients_per_round,
                                  numpy_rng(cfg.seed, "select", t))
        trainers = sorted({int(k) for sel in selected for k in sel})
        trained = {}
        for k in trainers:
            uk = torch.as_tensor(u[k], dtype=torch.float32, device=device)
            model, opt, x, y = models[k], opts[k], xs[k], ys[k]
            rng = numpy_rng(cfg.seed, "shuffle", k, t)
            for _ in range(cfg.train.local_epochs):
                order = torch.as_tensor(rng.permutation(len(y)), device=device)
                for i in range(0, len(y), cfg.train.batch_size):
                    idx = order[i:i + cfg.train.batch_size]
                    w = parameters_to_vector(model.parameters())
                    prox = 0.5 * lam * (uk * ((w[None, :] - centers) ** 2).sum(dim=1)).sum()
                    loss = F.mse_loss(model(x[idx]), y[idx]) + prox
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            trained[k] = parameters_to_vector(model.parameters()).detach().clone()
        centers = torch.stack([torch.stack([trained[int(k)] for k in sel]).mean(0) if len(sel) else centers[s]
                               for s, sel in enumerate(selected)])
        sync(device)
        stamps.append((t0, time.monotonic()))
        times.append(stamps[-1][1] - t0)
        updates.append(len(trainers))
    with torch.no_grad():
        mse = []
        for s in range(fed.num_distributions):
            x, y = (v.to(device) for v in fed.holdout(s))
            errs = []
            for c in centers:
                vector_to_parameters(c.clone(), scratch.parameters())
                errs.append(float(((scratch(x) - y) ** 2).mean()))
            mse.append(min(errs))
    return {"sec_per_round_all": times, "updates": updates, "quality": float(np.mean(mse)),
            "quality_metric": "center mse", "total_s": time.monotonic() - start,
            "timed_window": timed_window(stamps)}
