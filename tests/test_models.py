"""raysoft.models: output shapes, parameter counts worked out by hand, initialisation drawn from
the given generator only (same state, same weights), and the data/model fit check."""

import pytest
import torch
from torch import nn

from raysoft.catalog import CNNModel
from raysoft.config import ModelConfig
from raysoft.models import CifarCNN, ConvNet, DataInfo, LinearRegression, Logistic, build_model
from raysoft.params import get_flat

LINEAR = DataInfo(input_dim=7, num_outputs=1, task="regression")
LOGISTIC = DataInfo(input_dim=6, num_outputs=4, task="classification")
FMNIST = DataInfo(input_dim=784, num_outputs=10, task="classification", input_shape=(1, 28, 28))
CIFAR = DataInfo(input_dim=3072, num_outputs=10, task="classification", input_shape=(3, 32, 32))


def _count(model):
    return sum(p.numel() for p in model.parameters())


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_linear_regression_shape_and_count():
    model = build_model(ModelConfig(name="linear"), LINEAR, _gen(0))
    assert isinstance(model, LinearRegression)
    assert _count(model) == 7  # no bias
    x = torch.randn(5, 7)
    out = model(x)
    assert out.shape == (5,)  # squeezed: one prediction per sample
    torch.testing.assert_close(out, x @ get_flat(model))


def test_logistic_shape_and_count():
    model = build_model(ModelConfig(name="logistic"), LOGISTIC, _gen(0))
    assert isinstance(model, Logistic)
    assert _count(model) == 6 * 4 + 4
    assert model(torch.randn(3, 6)).shape == (3, 4)
    assert model(torch.randn(3, 2, 3)).shape == (3, 4)  # inputs are flattened


def test_cnn_parameter_count_by_hand():
    """conv 5x5 1->32 (+32), conv 5x5 32->64 (+64), FC 64*7*7 -> 512 (+512), FC 512 -> 10 (+10):
    28x28 pooled twice is 7x7."""
    model = build_model(CNNModel(name="cnn"), FMNIST, _gen(0))
    assert isinstance(model, ConvNet)
    want = (1 * 32 * 25 + 32) + (32 * 64 * 25 + 64) + (64 * 7 * 7 * 512 + 512) + (512 * 10 + 10)
    assert want == 1_663_370
    assert _count(model) == want
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_small_cnn_parameter_count_and_other_image_sizes():
    small = build_model(CNNModel(name="cnn", channels=[2, 4], hidden=8), FMNIST, _gen(0))
    assert _count(small) == (1 * 2 * 25 + 2) + (2 * 4 * 25 + 4) + (4 * 7 * 7 * 8 + 8) + (8 * 10 + 10) == 1922
    rgb = build_model(CNNModel(name="cnn", channels=[3, 5], hidden=6), CIFAR, _gen(0))
    assert _count(rgb) == (3 * 3 * 25 + 3) + (3 * 5 * 25 + 5) + (5 * 8 * 8 * 6 + 6) + (6 * 10 + 10)
    assert rgb(torch.randn(4, 3, 32, 32)).shape == (4, 10)


def test_cifar_cnn_parameter_count_by_hand():
    model = build_model(ModelConfig(name="cifar_cnn"), CIFAR, _gen(0))
    assert isinstance(model, CifarCNN)
    convs = [(3, 32), (32, 64), (64, 128), (128, 128), (128, 256), (256, 256)]
    want = sum(a * b * 9 + b for a, b in convs) + (256 * 4 * 4 * 1024 + 1024) + (1024 * 512 + 512) + (512 * 10 + 10)
    assert want == 5_851_338
    assert _count(model) == want
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_resnet18_for_32x32_inputs():
    model = build_model(ModelConfig(name="resnet18"), CIFAR, _gen(0))
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())  # GroupNorm instead
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_the_same_generator_state_gives_the_same_weights():
    for name, info in (("linear", LINEAR), ("logistic", LOGISTIC), ("cnn", FMNIST)):
        cfg = CNNModel(name=name, channels=[2, 4], hidden=8) if name == "cnn" else ModelConfig(name=name)
        a = get_flat(build_model(cfg, info, _gen(5)))
        assert torch.equal(a, get_flat(build_model(cfg, info, _gen(5)))), name
        assert not torch.equal(a, get_flat(build_model(cfg, info, _gen(6)))), name


def test_initialisation_draws_from_the_generator_only():
    cfg = ModelConfig(name="logistic")
    torch.manual_seed(0)
    a = get_flat(build_model(cfg, LOGISTIC, _gen(1)))
    torch.manual_seed(99)  # the global generator plays no part
    assert torch.equal(a, get_flat(build_model(cfg, LOGISTIC, _gen(1))))
    g = _gen(1)
    first, second = build_model(cfg, LOGISTIC, g), build_model(cfg, LOGISTIC, g)
    assert torch.equal(get_flat(first), a)
    assert not torch.equal(get_flat(second), a)  # the generator advanced
    assert torch.equal(get_flat(build_model(cfg, LOGISTIC)), get_flat(build_model(cfg, LOGISTIC, _gen(0))))


def test_xavier_normal_and_bias_bounds():
    """Xavier normal: std sqrt(2 / (fan_in + fan_out)) = sqrt(2 / 794) ~ 0.0502 for 784 -> 10;
    biases uniform in +-1/sqrt(fan_in) = +-1/28."""
    model = build_model(ModelConfig(name="logistic"), DataInfo(784, 10, "classification"), _gen(0))
    w, b = model.linear.weight.detach(), model.linear.bias.detach()
    assert float(w.mean()) == pytest.approx(0.0, abs=0.003)
    assert float(w.std()) == pytest.approx((2 / 794) ** 0.5, rel=0.05)
    assert float(b.abs().max()) <= 1 / 28


def test_normal_init_is_standard_normal():
    model = build_model(ModelConfig(name="logistic", init="normal"), DataInfo(784, 10, "classification"), _gen(0))
    assert float(model.linear.weight.detach().std()) == pytest.approx(1.0, rel=0.05)
    assert float(model.linear.bias.detach().abs().max()) > 1 / 28  # not the uniform bias


def test_channels_last_is_the_same_function():
    cfg = dict(name="cnn", channels=[2, 4], hidden=8)
    plain = build_model(CNNModel(**cfg), FMNIST, _gen(3))
    cl = build_model(CNNModel(**cfg, memory_format="channels_last"), FMNIST, _gen(3))
    assert cl.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(get_flat(plain), get_flat(cl))
    x = torch.randn(3, 1, 28, 28)
    torch.testing.assert_close(cl(x), plain(x))


@pytest.mark.parametrize("name, info", [("linear", LOGISTIC), ("logistic", LINEAR), ("cnn", LOGISTIC),
                                        ("cifar_cnn", LOGISTIC)])
def test_a_model_that_does_not_fit_the_data_is_an_error(name, info):
    with pytest.raises(ValueError, match=name):
        build_model(ModelConfig(name=name), info, _gen(0))


@pytest.mark.parametrize("shape", [(1, 1, 2, 2), (3, 2, 7, 9), (8, 4, 14, 14), (33, 16, 28, 28)])
def test_maxpool2x2_gives_max_pool2d_values_gradients_and_layout_bit_for_bit(shape):
    """raysoft's 2x2 pooling (a faster CPU path for NCHW batches) against nn.MaxPool2d(2): the
    same values, the same gradient (ties, which ReLU's zeros and blank image borders make common,
    routed to the first maximum; a -0.0 gradient as the kernel adds it to a zero), the same
    output layout, on one thread as the clients train."""
    from raysoft.models import MaxPool2x2

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.relu(torch.randn(shape, generator=gen)).round()  # many equal values
        for layout in (torch.contiguous_format, torch.channels_last):
            xs = [x.clone(memory_format=layout).requires_grad_() for _ in range(2)]
            ys = [torch.nn.MaxPool2d(2)(xs[0]), MaxPool2x2()(xs[1])]
            assert torch.equal(ys[0], ys[1]) and ys[0].stride() == ys[1].stride()
            g = torch.randn(ys[0].shape, generator=gen)
            g.view(-1)[0] = -0.0
            for y_ in ys:
                y_.backward(g)
            assert torch.equal(xs[0].grad, xs[1].grad) and torch.equal(xs[0].grad.signbit(), xs[1].grad.signbit())
            assert xs[0].grad.stride() == xs[1].grad.stride()
            with torch.no_grad():
                assert torch.equal(torch.nn.MaxPool2d(2)(xs[0]), MaxPool2x2()(xs[0]))
    finally:
        torch.set_num_threads(before)
