"""Batched multi-client training equals the per-client loop (float tolerance)."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

from raysoft import batched
from raysoft.batched import batched_proximal_train, buckets, can_batch, padding_ratio, stacked_forward, use_batched
from raysoft.config import TrainConfig
from raysoft.models import ConvNet, LinearRegression, Logistic
from raysoft.optim import SGD, Adam
from raysoft.params import get_flat, set_flat
from raysoft.training import proximal_train


def _clients(sizes, shape, task, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn((n, *shape), generator=g) for n in sizes]
    if task == "regression":
        ys = [torch.randn(n, generator=g) for n in sizes]
    else:
        ys = [torch.randint(0, 3, (n,), generator=g) for n in sizes]
    return xs, ys


def _opt(kind, params, lr, wd):
    return Adam(params, lr=lr, weight_decay=wd) if kind == "adam" else SGD(params, lr=lr, momentum=0.9, weight_decay=wd)


@pytest.mark.parametrize("rows", [None, 2])  # 2: a GPU's fixed shape (chunks of two, the last padded)
@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("arch", ["linear", "logistic", "cnn"])
def test_batched_training_equals_the_per_client_loop(kind, arch, rows):
    sizes = [23, 10, 37] if arch != "cnn" else [9, 4, 13]  # uneven: 3, 1 and 4 batches of 10 / 4
    if arch == "linear":
        model, shape, task = LinearRegression(5), (5,), "regression"
    elif arch == "logistic":
        model, shape, task = Logistic(6, 3), (6,), "classification"
    else:
        model, shape, task = ConvNet((1, 8, 8), 3, (2, 3), 8), (1, 8, 8), "classification"
    cfg = TrainConfig(optimizer=kind, lr=0.05, batch_size=10 if arch != "cnn" else 4, local_epochs=2,
                      shuffle=True, weight_decay=0.01)
    xs, ys = _clients(sizes, shape, task)
    torch.manual_seed(1)
    starts = [get_flat(type(model)(*_args(arch))) for _ in sizes]
    d = starts[0].numel()
    scale = torch.tensor([0.5, 0.0, 1.5])
    target = torch.randn(len(sizes), d) * 0.1

    # the loop: each client its own model and optimizer; one warm-up call to give the optimizers state
    loop_models = [copy.deepcopy(model) for _ in sizes]
    loop_opts = []
    for c, m in enumerate(loop_models):
        set_flat(m, starts[c])
        loop_opts.append(_opt(kind, m.parameters(), cfg.lr, cfg.weight_decay))
    batch_opts = []
    for c in range(len(sizes)):
        proximal_train(loop_models[c], loop_opts[c], xs[c], ys[c], task, cfg, rng=np.random.default_rng([7, c]))
    warm = torch.stack([get_flat(m) for m in loop_models])
    batch_opts = [copy.deepcopy(o) for o in loop_opts]
    for c in range(len(sizes)):
        proximal_train(loop_models[c], loop_opts[c], xs[c], ys[c], task, cfg, pull_scale=float(scale[c]),
                       pull_target=target[c], rng=np.random.default_rng([8, c]))
    expected = torch.stack([get_flat(m) for m in loop_models])

    got = batched_proximal_train(model, warm, batch_opts, xs, ys, task, cfg,
                                 [np.random.default_rng([8, c]) for c in range(len(sizes))],
                                 pull_scale=scale, pull_target=target, rows=rows)
    assert not torch.equal(got, warm)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    for lo, bo in zip(loop_opts, batch_opts):  # the optimizer state written back
        if kind == "adam":
            assert lo.steps == bo.steps
            for a, b in zip(lo.exp_avg + lo.exp_avg_sq, bo.exp_avg + bo.exp_avg_sq):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        else:
            for a, b in zip(lo.buffers, bo.buffers):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _args(arch):
    return {"linear": (5,), "logistic": (6, 3), "cnn": ((1, 8, 8), 3, (2, 3), 8)}[arch]


def test_a_client_with_fewer_batches_sits_out_the_extra_steps():
    """One lockstep computation of 6, 5 and 2 batches of 1: client 1 sits out one step an epoch,
    so its Adam takes 10 steps in 2 epochs to client 0's 12, and client 2 takes 4."""
    model = LinearRegression(3)
    cfg = TrainConfig(optimizer="adam", lr=0.1, batch_size=1, local_epochs=2)
    xs, ys = _clients([6, 5, 2], (3,), "regression")
    opts = [Adam(copy.deepcopy(model).parameters(), lr=0.1) for _ in range(3)]
    start = torch.zeros(3, get_flat(model).numel())
    batched_proximal_train(model, start, opts, xs, ys, "regression", cfg, [None, None, None])
    assert [o.steps for o in opts] == [12, 10, 4]


def _modelled_cost(groups, lengths, batch_size, params):
    """A step costs STEP_OVERHEAD / params samples; a step of mini-batches computes the clients
    still in their epoch (each client's own epoch in all), a full batch every client padded."""
    per_step = batched.STEP_OVERHEAD / params
    cost = 0.0
    for g in groups:
        longest = max(lengths[i] for i in g)
        steps = 1 if batch_size is None else -(-longest // batch_size)
        samples = sum(lengths[i] for i in g) if batch_size else len(g) * longest
        cost += per_step * steps + samples
    return cost


def _partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first], *part]
        for k in range(len(part)):
            yield [*part[:k], [first, *part[k]], *part[k + 1:]]


def test_buckets_by_hand():
    # STEP_OVERHEAD / 1000 parameters = a step costs as much as 100 samples (full batch: 1 step
    # an epoch). Sorted: 10 12 13 14 | 100 130 131 costs (100 + 4*14) + (100 + 3*131) = 649;
    # one bucket 100 + 7*131 = 1017; 10-14 | 100 | 130 131: 156 + 200 + 362 = 718.
    sizes = [100, 10, 12, 13, 14, 130, 131]
    assert buckets(sizes, None, int(batched.STEP_OVERHEAD / 100)) == [[1, 2, 3, 4], [0, 5, 6]]
    # a free step: each length its own bucket, equal lengths together, no padding at all
    assert buckets(sizes, None, 10**12) == [[1], [2], [3], [4], [0], [5], [6]]
    assert buckets([5, 5, 5], None, 10**12) == [[0, 1, 2]]
    assert padding_ratio(sizes, None, 10**12) == 1.0
    # padding_ratio of the first grouping: (4*14 + 3*131) / 410
    assert padding_ratio(sizes, None, int(batched.STEP_OVERHEAD / 100)) == pytest.approx((56 + 393) / 410)
    # mini-batches: each client computes its own epoch in any grouping, so one bucket (its 4
    # steps: 4*25 + 80 = 180) beats 10 | 30 40 (25 + 10 + 4*25 + 70 = 205)
    assert buckets([30, 10, 40], 10, int(batched.STEP_OVERHEAD / 25)) == [[1, 0, 2]]
    assert padding_ratio([30, 10, 40], 10, 1) == 1.0
    assert buckets([], None, 10) == []


@pytest.mark.parametrize("seed", range(30))
def test_buckets_are_the_cheapest_grouping(seed):
    """Against every partition of up to 7 clients (877 of them): no grouping is cheaper."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    batch_size = None if seed % 2 else int(rng.integers(1, 20))
    lengths = [int(x) for x in rng.integers(1, 60, n)]
    if batch_size:
        lengths = [-(-x // batch_size) * batch_size for x in lengths]
    params = int(batched.STEP_OVERHEAD / rng.choice([0.5, 5.0, 20.0, 100.0]))
    got = buckets(lengths, batch_size, params)
    assert sorted(i for g in got for i in g) == list(range(n))
    best = min(_modelled_cost(p, lengths, batch_size, params) for p in _partitions(list(range(n))))
    assert _modelled_cost(got, lengths, batch_size, params) == pytest.approx(best)


def test_buckets_bound_the_padding_of_heavy_tailed_sizes():
    # lognormal sizes, full batch, FPFC's 610-parameter model: one lockstep call would compute
    # 7 * 131 / 410 = 2.24x the samples on the 7 sizes above, and far more on these
    sizes = np.random.default_rng(0).lognormal(6, 1.5, 100).astype(int) + 1
    assert max(sizes) * len(sizes) / sum(sizes) > 5
    assert padding_ratio(sizes, None, 610) <= 1.3  # the padding bound asked of the buckets
    # W1's clients (100-200 samples, batches of 10, a 61-parameter model): one bucket
    assert len(buckets([-(-n // 10) * 10 for n in range(100, 201)], 10, 61)) == 1


@pytest.mark.parametrize("arch", ["linear", "logistic"])
def test_the_stacked_forward_is_vmaps_computation_bit_for_bit(arch):
    from torch.func import functional_call, vmap

    model = LinearRegression(7) if arch == "linear" else Logistic(12, 4)
    shape = (7,) if arch == "linear" else (3, 2, 2)  # the logistic model flattens its input
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    sizes = [p.numel() for _, p in model.named_parameters()]

    def one(flat, xb):
        return functional_call(model, {n: t.view(s) for n, t, s in zip(names, torch.split(flat, sizes), shapes)}, (xb,))

    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(5, sum(sizes), generator=g), torch.randn(5, 9, *shape, generator=g)
    grads = []
    for f in (vmap(one), stacked_forward(model)):
        wr = w.clone().requires_grad_(True)
        out = f(wr, x)
        (out.square() * torch.arange(out.numel()).view(out.shape)).sum().backward()
        grads.append((out.detach(), wr.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    assert stacked_forward(ConvNet((1, 8, 8), 3, (2, 3), 8)) is None


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_a_clients_result_does_not_depend_on_its_row(kind):
    """The rows are reordered longest epoch first inside a call: permuting the clients of a
    call permutes the result, bit for bit, optimizer state included."""
    sizes = [7, 31, 18, 31, 2]
    model, cfg = Logistic(4, 3), TrainConfig(optimizer=kind, lr=0.1, batch_size=5, local_epochs=2, shuffle=True)
    xs, ys = _clients(sizes, (4,), "classification", seed=5)
    torch.manual_seed(3)
    start = torch.stack([get_flat(Logistic(4, 3)) for _ in sizes])
    target = torch.randn(len(sizes), start.shape[1])

    def run(perm):
        opts = [_opt(kind, copy.deepcopy(model).parameters(), 0.1, 0.0) for _ in perm]
        w = batched_proximal_train(
            model,
            start[perm],
            opts,
            [xs[c] for c in perm],
            [ys[c] for c in perm],
            "classification",
            cfg,
            [np.random.default_rng([9, c]) for c in perm],
            pull_scale=torch.ones(len(perm)),
            pull_target=target[perm],
        )
        state = [o.exp_avg[0] if kind == "adam" else o.buffers[0] for o in opts]
        return w, state, [getattr(o, "steps", 0) for o in opts]

    w0, s0, n0 = run([0, 1, 2, 3, 4])
    perm = [4, 2, 0, 3, 1]
    w1, s1, n1 = run(perm)
    assert torch.equal(w1, w0[perm])
    assert all(torch.equal(a, s0[c]) for a, c in zip(s1, perm)) and n1 == [n0[c] for c in perm]


def test_full_batch_heavy_tailed_clients_equal_the_loop(monkeypatch):
    """Full-batch steps on sizes spread over many buckets (a free step: one bucket per size):
    every client as if trained alone."""
    monkeypatch.setattr(batched, "STEP_OVERHEAD", 0.0)
    sizes = [3, 40, 5, 200, 41, 7, 90]
    model, task = Logistic(4, 3), "classification"
    cfg = TrainConfig(optimizer="sgd", lr=0.1, batch_size=None, local_epochs=3)
    xs, ys = _clients(sizes, (4,), task)
    torch.manual_seed(2)
    start = torch.stack([get_flat(Logistic(4, 3)) for _ in sizes])
    expected = []
    for c in range(len(sizes)):
        m = copy.deepcopy(model)
        set_flat(m, start[c])
        proximal_train(m, SGD(m.parameters(), lr=0.1), xs[c], ys[c], task, cfg, rng=None)
        expected.append(get_flat(m))
    opts = [SGD(copy.deepcopy(model).parameters(), lr=0.1) for _ in sizes]
    got = batched_proximal_train(model, start, opts, xs, ys, task, cfg, [None] * len(sizes))
    assert len(buckets(sizes, None, 15)) == 7
    torch.testing.assert_close(got, torch.stack(expected), rtol=1e-5, atol=1e-6)


def test_use_batched_by_model_and_mode():
    lin, cnn = LinearRegression(3), ConvNet((1, 8, 8), 3, (2, 3), 8)
    assert use_batched(TrainConfig(), "linear", lin)
    assert not use_batched(TrainConfig(), "cnn", cnn)
    assert use_batched(TrainConfig(batched_clients="on"), "cnn", cnn)
    assert not use_batched(TrainConfig(batched_clients="off"), "linear", lin)
    bn = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    assert can_batch(bn) == "BatchNorm1d layers"
    assert not use_batched(TrainConfig(batched_clients="on"), "linear", bn)


def test_a_channels_last_model_is_the_same_function_and_vector():
    from raysoft.catalog import CNNModel
    from raysoft.models import DataInfo, build_model

    info = DataInfo(input_dim=784, num_outputs=10, task="classification", input_shape=(1, 28, 28))
    plain = build_model(CNNModel(name="cnn", channels=[4, 8], hidden=16), info, torch.Generator().manual_seed(3))
    fast = build_model(CNNModel(name="cnn", channels=[4, 8], hidden=16, memory_format="channels_last"), info,
                       torch.Generator().manual_seed(3))
    assert fast.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not fast.features[3].weight.is_contiguous()
    assert torch.equal(get_flat(plain), get_flat(fast))  # the logical order, whatever the layout
    g = torch.Generator().manual_seed(4)  # not the global stream: other tests move it
    x = torch.rand(5, 1, 28, 28, generator=g)
    torch.testing.assert_close(fast(x), plain(x), rtol=1e-5, atol=1e-5)
    vec = 0.1 * torch.randn(get_flat(plain).shape, generator=g)
    set_flat(fast, vec)
    set_flat(plain, vec)
    assert torch.equal(get_flat(fast), vec)
    torch.testing.assert_close(fast(x), plain(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_fixed_rows_give_every_client_the_same_numbers_in_any_packing(kind):
    """With ``rows`` (a GPU's fixed shape) every kernel has ``rows`` rows, padded; a client's
    trained vector and optimizer state are then bit-identical whichever clients share its call
    (uneven sizes: clients whose epoch ends early sit out the masked steps)."""
    model, sizes = ConvNet((1, 8, 8), 3, (2, 3), 8), [9, 4, 13, 6, 11]
    cfg = TrainConfig(optimizer=kind, lr=0.05, batch_size=4, local_epochs=2, shuffle=True, weight_decay=0.01)
    xs, ys = _clients(sizes, (1, 8, 8), "classification", seed=3)
    torch.manual_seed(2)
    start = torch.stack([get_flat(ConvNet((1, 8, 8), 3, (2, 3), 8)) for _ in sizes])

    def train(ids):
        opts = [_opt(kind, copy.deepcopy(model).parameters(), cfg.lr, cfg.weight_decay) for _ in ids]
        w = batched_proximal_train(model, start[ids].clone(), opts, [xs[i] for i in ids], [ys[i] for i in ids],
                                   "classification", cfg, [np.random.default_rng([5, i]) for i in ids], rows=3)
        return dict(zip(ids, w)), dict(zip(ids, opts))

    together, opts_together = train([0, 1, 2, 3, 4])  # chunks [0, 1, 2] and [3, 4] + a padding row
    apart, opts_apart = {}, {}
    for ids in ([4, 1], [2], [0, 3]):
        w, o = train(ids)
        apart.update(w)
        opts_apart.update(o)
    for k in range(len(sizes)):
        assert torch.equal(together[k], apart[k]), k
        state = "exp_avg" if kind == "adam" else "buffers"
        for a, b in zip(getattr(opts_together[k], state), getattr(opts_apart[k], state)):
            assert torch.equal(a, b)
    assert not torch.equal(together[0], start[0])


def test_on_a_gpu_auto_batches_every_model_it_can_but_not_full_batches():
    cnn, gpu = ConvNet((1, 8, 8), 3, (2, 3), 8), torch.device("cuda")
    assert use_batched(TrainConfig(), "cnn", cnn, gpu)
    assert not use_batched(TrainConfig(), "cnn", cnn, torch.device("cpu"))
    assert not use_batched(TrainConfig(batch_size=None), "linear", LinearRegression(3), gpu)  # its width: the packing's
    assert not use_batched(TrainConfig(batched_clients="off"), "cnn", cnn, gpu)
