"""Batched multi-client training equals the per-client loop (float tolerance)."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

from raysoft.batched import batched_proximal_train, buckets, can_batch, padding_ratio, use_batched
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


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("arch", ["linear", "logistic", "cnn"])
def test_batched_training_equals_the_per_client_loop(kind, arch):
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
                                 pull_scale=scale, pull_target=target)
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
    """One bucket (6 and 5 batches of 1: 6 <= 1.3 * 5): client 1 sits out one step an epoch, so
    its Adam takes 10 steps in 2 epochs to client 0's 12; a client with 2 batches goes into its
    own bucket and takes 4."""
    model = LinearRegression(3)
    cfg = TrainConfig(optimizer="adam", lr=0.1, batch_size=1, local_epochs=2)
    xs, ys = _clients([6, 5, 2], (3,), "regression")
    opts = [Adam(copy.deepcopy(model).parameters(), lr=0.1) for _ in range(3)]
    start = torch.zeros(3, get_flat(model).numel())
    batched_proximal_train(model, start, opts, xs, ys, "regression", cfg, [None, None, None])
    assert [o.steps for o in opts] == [12, 10, 4]


def test_buckets_bound_the_padding():
    assert buckets([100, 10, 12, 13, 14, 130, 131]) == [[1, 2, 3], [4], [0, 5], [6]]
    assert buckets([5, 5, 5]) == [[0, 1, 2]]
    # full batch: 10, 12, 13 padded to 13 (39), 14 alone, 100 and 130 padded to 130, 131 alone
    assert padding_ratio([100, 10, 12, 13, 14, 130, 131], None) == pytest.approx((39 + 14 + 260 + 131) / 410)
    # batches of 10: 23 -> 30 and 37 -> 40 (40 > 1.3 * 30: two buckets), 10 alone
    assert padding_ratio([23, 10, 37], 10) == 1.0
    # one lockstep call padded everything to 131: 7 * 131 / 410 = 2.24
    sizes = np.random.default_rng(0).lognormal(6, 1.5, 100).astype(int) + 1
    assert padding_ratio(sizes, None) <= 1.3


def test_full_batch_heavy_tailed_clients_equal_the_loop():
    """Full-batch steps on sizes spread over many buckets: every client as if trained alone."""
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
    assert len(buckets(sizes)) == 6
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
    from raysoft.config import ModelConfig
    from raysoft.models import DataInfo, build_model

    info = DataInfo(input_dim=784, num_outputs=10, task="classification", input_shape=(1, 28, 28))
    plain = build_model(ModelConfig(name="cnn", channels=[4, 8], hidden=16), info, torch.Generator().manual_seed(3))
    fast = build_model(ModelConfig(name="cnn", channels=[4, 8], hidden=16, memory_format="channels_last"), info,
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
