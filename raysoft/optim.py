"""Lean client optimizers (Adam, SGD with momentum) with explicit state.

They follow ``torch.optim.Adam`` / ``torch.optim.SGD`` update rules operation for operation
(tested against them), without the per-step Python machinery of ``torch.optim`` that
dominates the cost of the small models of federated experiments. Their state (step count,
moment buffers) is plain tensors, kept by the client across rounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

import torch


class _Base:
    def __init__(self, params: Iterable[torch.nn.Parameter]) -> None:
        self.params = [p for p in params]

    def bind(self, params: Iterable[torch.nn.Parameter]) -> _Base:
        """Point the optimizer at other parameters of the same shapes (e.g. a shared scratch
        model); its state (moments, step count) stays its own."""
        params = [p for p in params]
        if [p.shape for p in params] != [p.shape for p in self.params]:
            raise ValueError("bind: parameter shapes differ")
        self.params = params
        return self

    def zero_grad(self, set_to_none: bool = False) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()


def adam_update_(w: torch.Tensor, m: torch.Tensor, v: torch.Tensor, g: torch.Tensor, betas: tuple[float, float],
                 eps: float, step_size: float | torch.Tensor, bc2_sqrt: float | torch.Tensor) -> None:
    """One Adam step, in place on the parameters ``w`` and the moments ``m``, ``v``, from the
    gradient ``g`` (weight decay already added): ``step_size`` is lr / bias correction 1 and
    ``bc2_sqrt`` the square root of bias correction 2, numbers (one optimizer,
    :meth:`Adam.step`) or tensors broadcast over rows (the clients of a lockstep call,
    :mod:`raysoft.batched`). The one place the step's maths is written: a number takes
    ``torch.optim.Adam``'s ``addcdiv_``, a tensor (which ``addcdiv_`` does not take) the same
    product written out, ``w - step_size * m / denom``, as the lockstep step always did."""
    b1, b2 = betas
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g.conj(), value=1 - b2)
    denom = (v.sqrt() / bc2_sqrt).add_(eps)
    if isinstance(step_size, torch.Tensor):
        w.sub_(step_size * m / denom)
    else:
        w.addcdiv_(m, denom, value=-step_size)


class Adam(_Base):
    """Adam (Kingma & Ba), L2 weight decay added to the gradient as in torch.optim.Adam."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.steps = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self) -> None:
        b1, b2 = self.betas
        self.steps += 1
        bc1 = 1 - b1**self.steps
        bc2_sqrt = math.sqrt(1 - b2**self.steps)
        step_size = self.lr / bc1
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):
            grad = cast(torch.Tensor, p.grad)  # every parameter has one after backward
            g = grad if not self.weight_decay else grad.add(p, alpha=self.weight_decay)
            adam_update_(p, m, v, g, self.betas, self.eps, step_size, bc2_sqrt)


class SGD(_Base):
    """SGD with optional momentum (dampening 0, no Nesterov) and L2 weight decay."""

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        super().__init__(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            grad = cast(torch.Tensor, p.grad)  # every parameter has one after backward
            g = grad if not self.weight_decay else grad.add(p, alpha=self.weight_decay)
            if self.momentum:
                buf = self.buffers[i]
                if buf is None:
                    buf = self.buffers[i] = g.clone()
                else:
                    buf.mul_(self.momentum).add_(g)
                g = buf
            p.add_(g, alpha=-self.lr)
