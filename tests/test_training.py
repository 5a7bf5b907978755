"""raysoft.training: per-sample losses, the proximal solver's steps by hand on a linear model,
chunked scoring equal to one batch, and the client optimizer."""

import math

import numpy as np
import pytest
import torch

from raysoft.config import TrainConfig
from raysoft.models import LinearRegression, Logistic
from raysoft.optim import SGD, Adam
from raysoft.params import get_flat, set_flat
from raysoft.training import (
    EVAL_CHUNK,
    batch_order,
    evaluate,
    full_gradient,
    make_optimizer,
    model_losses,
    outputs,
    per_sample_loss,
    proximal_train,
)

# The linear model y = <x, w> on two samples: x0 = (1, 0), y0 = 0 and x1 = (0, 2), y1 = 1. At
# w = (1, 1) the outputs are (1, 2), the residuals (1, 1), the mean squared error 1 and its
# gradient (2/2) * (1 * x0 + 1 * x1) = (1, 2).
X = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
Y = torch.tensor([0.0, 1.0])


def _linear(w=(1.0, 1.0)):
    model = LinearRegression(2)
    set_flat(model, torch.tensor(w))
    return model


def _sgd_cfg(**kw):
    return TrainConfig(**{"optimizer": "sgd", "lr": 0.1, "batch_size": None, "local_epochs": 1, **kw})


def _train(model, cfg, **kw):
    return proximal_train(model, make_optimizer(cfg, model.parameters()), X, Y, "regression", cfg, **kw)


def test_per_sample_loss_by_hand():
    assert per_sample_loss(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0]), "regression").tolist() == [1.0, 4.0]
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    ce = per_sample_loss(logits, torch.tensor([1, 0]), "classification")
    assert ce.tolist() == pytest.approx([-math.log(0.75), math.log(2.0)])  # softmax (1/4, 3/4), (1/2, 1/2)


def test_one_full_batch_sgd_step_by_hand():
    model = _linear()
    loss = _train(model, _sgd_cfg())
    assert loss == pytest.approx(1.0)  # the mean loss of the epoch, before the step
    assert get_flat(model).tolist() == pytest.approx([1 - 0.1 * 1, 1 - 0.1 * 2])


def test_the_proximal_pull_adds_a_w_minus_b_to_the_gradient():
    """a = 0.5, b = (1, -1): the gradient (1, 2) + 0.5 * (1, 1) - (1, -1) = (0.5, 3.5)."""
    model = _linear()
    loss = _train(model, _sgd_cfg(), pull_scale=0.5, pull_target=torch.tensor([1.0, -1.0]))
    assert loss == pytest.approx(1.0)  # the data loss: the pull is not part of it
    assert get_flat(model).tolist() == pytest.approx([1 - 0.1 * 0.5, 1 - 0.1 * 3.5])


def test_fedprox_pull_towards_the_point_itself_changes_nothing_of_the_step():
    """a = mu, b = mu * anchor with the anchor at w: the pull's gradient mu * (w - anchor) is 0."""
    model = _linear()
    _train(model, _sgd_cfg(), pull_scale=2.0, pull_target=2.0 * torch.tensor([1.0, 1.0]))
    assert get_flat(model).tolist() == pytest.approx([0.9, 0.8])


def test_the_pull_target_is_not_modified():
    target = torch.tensor([1.0, -1.0])
    _train(_linear(), _sgd_cfg(local_epochs=3), pull_scale=0.5, pull_target=target)
    assert target.tolist() == [1.0, -1.0]


def test_mini_batches_in_the_fixed_order_by_hand():
    """Batch size 1: sample 0 (residual 1, gradient 2 * x0 = (2, 0)) gives w = (0.8, 1); then sample 1
    (output 2, residual 1, gradient 2 * x1 = (0, 4)) gives w = (0.8, 0.6)."""
    model = _linear()
    loss = _train(model, _sgd_cfg(batch_size=1))
    assert loss == pytest.approx(1.0)  # (1 * 1 + 1 * 1) / 2
    assert get_flat(model).tolist() == pytest.approx([0.8, 0.6])


def test_sample_weights_scale_each_samples_loss():
    """q = (2, 0): the loss (2 * 1 + 0 * 1) / 2 = 1, its gradient (1/2) * 2 * 2 * x0 = (2, 0)."""
    model = _linear()
    loss = _train(model, _sgd_cfg(), sample_weights=torch.tensor([2.0, 0.0]))
    assert loss == pytest.approx(1.0)
    assert get_flat(model).tolist() == pytest.approx([0.8, 1.0])


def test_epochs_overrides_local_epochs_and_the_last_epochs_loss_is_returned():
    """Two full-batch steps: w = (0.9, 0.8), then residuals (0.9, 0.6), loss (0.81 + 0.36) / 2."""
    model = _linear()
    loss = _train(model, _sgd_cfg(local_epochs=5), epochs=2)
    assert loss == pytest.approx((0.81 + 0.36) / 2)
    # gradient at (0.9, 0.8): (0.9 * x0 + 0.6 * x1) = (0.9, 1.2)
    assert get_flat(model).tolist() == pytest.approx([0.9 - 0.09, 0.8 - 0.12])


def test_batch_order():
    cfg = _sgd_cfg()
    assert batch_order(5, 0, cfg, None).tolist() == [0, 1, 2, 3, 4]
    shuffled = _sgd_cfg(shuffle=True)
    with pytest.raises(ValueError, match="random generator"):
        batch_order(5, 0, shuffled, None)
    got = batch_order(50, 0, shuffled, np.random.default_rng(1))
    assert got.tolist() == np.random.default_rng(1).permutation(50).tolist()
    with pytest.raises(ValueError, match="random generator"):
        _train(_linear(), shuffled)


def test_full_gradient_by_hand():
    assert full_gradient(_linear(), X, Y, "regression").tolist() == pytest.approx([1.0, 2.0])


def test_the_optimizer_state_persists_across_calls():
    """One optimizer per client, kept across rounds: two calls of one epoch (SGD with momentum, and
    Adam) end where one call of two epochs does."""
    for kw in ({"momentum": 0.9}, {"optimizer": "adam"}):
        cfg = _sgd_cfg(**kw)
        once, twice = _linear(), _linear()
        _train(once, cfg, epochs=2)
        opt = make_optimizer(cfg, twice.parameters())
        for _ in range(2):
            proximal_train(twice, opt, X, Y, "regression", cfg)
        assert torch.equal(get_flat(once), get_flat(twice)), kw


def test_make_optimizer_follows_the_config():
    model = _linear()
    adam = make_optimizer(TrainConfig(optimizer="adam", lr=0.01, weight_decay=0.1), model.parameters())
    assert isinstance(adam, Adam) and (adam.lr, adam.weight_decay) == (0.01, 0.1)
    sgd = make_optimizer(TrainConfig(optimizer="sgd", lr=0.2, momentum=0.5), model.parameters())
    assert isinstance(sgd, SGD) and (sgd.lr, sgd.momentum, sgd.weight_decay) == (0.2, 0.5, 0.0)
    assert [p is q for p, q in zip(sgd.params, model.parameters())] == [True]


def test_sgd_weight_decay_step_by_hand():
    """weight decay 0.5 adds 0.5 * w = (0.5, 0.5) to the gradient (1, 2)."""
    model = _linear()
    _train(model, _sgd_cfg(weight_decay=0.5))
    assert get_flat(model).tolist() == pytest.approx([1 - 0.1 * 1.5, 1 - 0.1 * 2.5])


def _logistic_data(n, dim=5, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    model = Logistic(dim, classes)
    x = torch.randn(n, dim, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    vectors = torch.randn(4, dim * classes + classes, generator=g)
    return model, x, y, vectors


def test_outputs_in_chunks_equal_one_batch():
    model, x, _, _ = _logistic_data(2 * EVAL_CHUNK + 5)
    with torch.no_grad():
        whole = model(x)
    torch.testing.assert_close(outputs(model, x), whole)
    torch.testing.assert_close(outputs(model, x, chunk=7), whole)
    assert not outputs(model, x).requires_grad


def test_model_losses_are_each_vectors_per_sample_losses():
    model, x, y, vectors = _logistic_data(2 * EVAL_CHUNK + 5)
    kept = vectors.clone()
    got = model_losses(model, vectors, x, y, "classification")
    assert got.shape == (4, len(y))
    for m, vec in enumerate(vectors):
        w, b = vec[:15].view(3, 5), vec[15:]
        want = torch.nn.functional.cross_entropy(x @ w.T + b, y, reduction="none")
        torch.testing.assert_close(got[m], want)
    assert torch.equal(vectors, kept)


def test_evaluate_by_hand():
    model = _linear()
    assert evaluate(model, X, Y, "regression") == {"mse": pytest.approx(1.0)}
    logistic = Logistic(2, 2)
    set_flat(logistic, torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0]))  # logits = x
    x = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0], [3.0, 1.0]])
    y = torch.tensor([0, 0, 1, 0])
    got = evaluate(logistic, x, y, "classification")
    # argmax (ties to the first): 0, 1, 0, 0 -> right, wrong, wrong, right
    assert got["accuracy"] == pytest.approx(0.5)
    want = [math.log(1 + math.exp(-2)), math.log(1 + math.e), math.log(2), math.log(1 + math.exp(-2))]
    assert got["loss"] == pytest.approx(sum(want) / 4)


def test_evaluate_in_chunks_equals_one_batch():
    model, x, y, vectors = _logistic_data(3 * EVAL_CHUNK + 1)
    set_flat(model, vectors[0])
    got = evaluate(model, x, y, "classification")
    with torch.no_grad():
        out = model(x)
    assert got["loss"] == pytest.approx(float(per_sample_loss(out, y, "classification").mean()), rel=1e-6)
    assert got["accuracy"] == float((out.argmax(-1) == y).float().mean())
