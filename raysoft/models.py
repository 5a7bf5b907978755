"""Model registry: ``build_model(model_cfg, data_info, generator)``.

Initialisation follows FedSoft's reference code: Xavier-normal weights for linear layers
(the paper: "randomly initialized with the Xavier normal initializer without pre-training").
"""

from __future__ import annotations

import torch
from torch import nn

from .catalog import LEAF_CHARS, CharLSTMModel, CNNModel, ConvModel, model_misfit
from .config import ModelConfig
from .plugins import PluginError
from .protocols import DataInfo, ModelFactory


class LinearRegression(nn.Module):
    """y = <x, w>: FedSoft's synthetic model, Linear(d -> 1) without bias."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).squeeze(-1)


class _MaxPool2x2Fn(torch.autograd.Function):
    """``max_pool2d(x, 2)`` of a contiguous (NCHW) batch computed in the channels-last layout,
    where PyTorch's CPU kernel is several times faster than its NCHW kernel (which, for the
    benchmark CNNs on one thread, took about as long as the convolutions: docs/performance.md).
    The values are the same; the gradient is the NCHW kernel's, bit for bit: each output's
    gradient added to a zero at its window's argmax (the indices the kernel returns, per
    channel plane, whatever the layout), returned contiguous as the rest of the model expects."""

    @staticmethod
    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, idx = torch.nn.functional.max_pool2d(x.contiguous(memory_format=torch.channels_last), 2,
                                                return_indices=True)
        return y.contiguous(), idx

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.shape = inputs[0].shape
        ctx.save_for_backward(output[1])
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _idx: torch.Tensor) -> torch.Tensor:
        (idx,) = ctx.saved_tensors
        *lead, h, w = ctx.shape
        out = grad.new_zeros(*lead, h * w)
        out.scatter_add_(-1, idx.reshape(*lead, -1), grad.reshape(*lead, -1))
        return out.view(ctx.shape)


def _plain_nchw(x: torch.Tensor) -> bool:
    """A 4-d CPU tensor in the contiguous (NCHW) layout and not also a channels-last one."""
    try:
        return (x.dim() == 4 and not x.is_cuda and x.is_contiguous()
                and not x.is_contiguous(memory_format=torch.channels_last))
    except RuntimeError:  # inside torch.func.vmap, where layouts cannot be queried: PyTorch's kernel
        return False


class MaxPool2x2(nn.Module):
    """``nn.MaxPool2d(2)`` with the same values and gradients, faster on CPU (:class:`_MaxPool2x2Fn`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # PyTorch's own kernel wherever it is not the slow NCHW one, and so its own output layout:
        # a channels-last input (a convolution of a one-channel image may give one) stays
        # channels-last, and the next convolution, whose numbers depend on the layout, sees it
        if not _plain_nchw(x):
            return torch.nn.functional.max_pool2d(x, 2)
        if torch.is_grad_enabled() and x.requires_grad:
            return _MaxPool2x2Fn.apply(x)[0]
        return torch.nn.functional.max_pool2d(x.contiguous(memory_format=torch.channels_last), 2).contiguous()


class Logistic(nn.Module):
    """Multinomial logistic regression: Linear(d -> C) logits (FPFC's Mclr_Logistic)."""

    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


class ConvNet(nn.Module):
    """conv5x5(c1)-ReLU-pool2, conv5x5(c2)-ReLU-pool2, FC(hidden)-ReLU, FC(classes); padding 2.

    FedSoft's LettersCNN with its missing ReLUs and double softmax fixed (docs/algorithms.md#models),
    and the 28x28 CNN of the benchmark workloads (32/64 channels, FC 512).
    """

    def __init__(self, shape: tuple[int, ...], classes: int, channels: tuple[int, ...], hidden: int) -> None:
        super().__init__()
        c, h, w = shape
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(c, c1, 5, padding=2), nn.ReLU(), MaxPool2x2(),
            nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), MaxPool2x2(),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(c2 * (h // 4) * (w // 4), hidden), nn.ReLU(), nn.Linear(hidden, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class CifarCNN(nn.Module):
    """FedSoft's Cifar10CnnModel: 3 blocks of two 3x3 convs (32/64, 128/128, 256/256) with
    ReLU and max-pool, then FC 1024-512-classes."""

    def __init__(self, shape: tuple[int, ...], classes: int) -> None:
        super().__init__()
        c, h, w = shape
        layers: list[nn.Module] = []
        for a, b in ((c, 32), (32, 64)), ((64, 128), (128, 128)), ((128, 256), (256, 256)):
            layers += [nn.Conv2d(a[0], a[1], 3, padding=1), nn.ReLU(), nn.Conv2d(b[0], b[1], 3, padding=1),
                       nn.ReLU(), MaxPool2x2()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(256 * (h // 8) * (w // 8), 1024), nn.ReLU(), nn.Linear(1024, 512),
            nn.ReLU(), nn.Linear(512, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class CharLSTM(nn.Module):
    """LEAF's character LSTM (its shakespeare/stacked_lstm.py): each of a line's characters
    embedded (``embedding``), ``layers`` stacked LSTM layers of ``hidden`` units, and the logits
    of the next character from the last step's output."""

    def __init__(self, vocab: int, classes: int, embedding: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(x.long()))
        return self.head(out[:, -1])


def resnet18_32(shape: tuple[int, ...], classes: int) -> nn.Module:
    """torchvision's ResNet-18 adapted to 32x32 inputs: a 3x3 stride-1 first convolution and no
    max-pool. BatchNorm is replaced by GroupNorm (2 groups), the usual choice in federated
    learning (Hsieh et al., ICML 2020): BN's running statistics are per-client state outside the
    parameters, which averaging and the proximal terms would not cover."""
    from torchvision.models import resnet18

    model = resnet18(num_classes=classes, norm_layer=lambda c: nn.GroupNorm(2, c))
    model.conv1 = nn.Conv2d(shape[0], 64, 3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def _init(model: nn.Module, how: str, generator: torch.Generator) -> None:
    """Xavier-normal linear layers (or torch's default), Kaiming-uniform convs (torch's default);
    biases as torch's default; embeddings N(0, 1) and LSTM weights U(-1/sqrt(hidden),
    1/sqrt(hidden)) (torch's defaults); all drawn from ``generator``."""
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, generator=generator)
        elif isinstance(m, nn.LSTM):
            bound = 1 / m.hidden_size**0.5
            for w in m.parameters():
                nn.init.uniform_(w, -bound, bound, generator=generator)
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            if how == "xavier_normal" and isinstance(m, nn.Linear):
                nn.init.xavier_normal_(m.weight, generator=generator)
            elif how == "normal":
                nn.init.normal_(m.weight, generator=generator)
            else:
                nn.init.kaiming_uniform_(m.weight, a=5**0.5, generator=generator)
            if m.bias is not None:
                if how == "normal":
                    nn.init.normal_(m.bias, generator=generator)
                else:
                    fan_in = m.weight[0].numel()
                    bound = 1 / fan_in**0.5
                    nn.init.uniform_(m.bias, -bound, bound, generator=generator)


def _built_in(cfg: ModelConfig, info: DataInfo, generator: torch.Generator, make) -> nn.Module:
    """A built-in model: checked against the data, made by ``make()``, initialised from
    ``generator`` and laid out as ``memory_format`` says."""
    why = model_misfit(cfg.name, info.task, info.input_shape)
    if why is not None:
        raise ValueError(why)
    model = make()
    _init(model, cfg.init, generator)
    channels_last = isinstance(cfg, ConvModel) and cfg.memory_format == "channels_last"
    if channels_last and any(isinstance(m, nn.Conv2d) for m in model.modules()):
        model = model.to(memory_format=torch.channels_last)
    return model


# the built-in models' factories, registered in raysoft's pyproject.toml (group raysoft.models)
def linear(cfg: ModelConfig, info: DataInfo, generator: torch.Generator) -> nn.Module:
    """Linear regression (the synthetic data of FedSoft)."""
    return _built_in(cfg, info, generator, lambda: LinearRegression(info.input_dim))


def logistic(cfg: ModelConfig, info: DataInfo, generator: torch.Generator) -> nn.Module:
    """Multinomial logistic regression."""
    return _built_in(cfg, info, generator, lambda: Logistic(info.input_dim, info.num_outputs))


def cnn(cfg: CNNModel, info: DataInfo, generator: torch.Generator) -> nn.Module:
    """Two convolutions and two fully connected layers (FedSoft's letters CNN)."""
    return _built_in(cfg, info, generator,
                     lambda: ConvNet(info.input_shape, info.num_outputs, tuple(cfg.channels), cfg.hidden))


def cifar_cnn(cfg: ModelConfig, info: DataInfo, generator: torch.Generator) -> nn.Module:
    """FedSoft's CIFAR-10 CNN."""
    return _built_in(cfg, info, generator, lambda: CifarCNN(info.input_shape, info.num_outputs))


def resnet18(cfg: ModelConfig, info: DataInfo, generator: torch.Generator) -> nn.Module:
    """torchvision's ResNet-18 for 32x32 inputs, GroupNorm instead of BatchNorm."""
    return _built_in(cfg, info, generator, lambda: resnet18_32(info.input_shape, info.num_outputs))


def leaf_cnn(cfg: ModelConfig, info: DataInfo, generator: torch.Generator) -> nn.Module:
    """LEAF's FEMNIST CNN: 5x5 convolutions of 32 and 64 channels ("same" padding), each with
    ReLU and a 2x2 max-pool, a dense layer of 2048, the class logits."""
    return _built_in(cfg, info, generator, lambda: ConvNet(info.input_shape, info.num_outputs, (32, 64), 2048))


def char_lstm(cfg: CharLSTMModel, info: DataInfo, generator: torch.Generator) -> nn.Module:
    """LEAF's character LSTM over LEAF's 80 characters (embedding 8, two layers of 256)."""
    return _built_in(cfg, info, generator,
                     lambda: CharLSTM(len(LEAF_CHARS), info.num_outputs, cfg.embedding, cfg.units, cfg.layers))


def build_model(cfg: ModelConfig, info: DataInfo, generator: torch.Generator | None = None) -> nn.Module:
    """A freshly initialised model of the factory ``cfg.name`` names (:mod:`raysoft.plugins`:
    built-in, registered or an import path), called as ``factory(cfg, info, generator)``; the
    same generator state gives the same weights."""
    factory: ModelFactory[ModelConfig] = cfg.plugin.load()
    model = factory(cfg, info, generator if generator is not None else torch.Generator().manual_seed(0))
    if not isinstance(model, nn.Module):
        raise PluginError(f"model {cfg.name!r}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    return model
