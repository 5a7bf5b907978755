"""Lean client optimizers (Adam, SGD with momentum) with explicit state.

They follow ``torch.optim.Adam`` / ``torch.optim.SGD`` update rules operation for operation
(tested against them), without the per-step Python machinery of ``torch.optim`` that
dominates the cost of the small models of federated experiments. Their state (step count,
moment buffers) is plain tensors, kept by the client across rounds.

The parameters an optimizer updates are bound to it (:meth:`~_Base.bind`: a host's shared
scratch model, or a client's own model) but are not part of its state: copying, pickling or
checkpointing an optimizer, or moving it to another device, carries its moments only, and the
copy is unbound until a client op binds it again (``train_from``, ``proximal_train``). A client
state therefore never carries a copy of the scratch model, whatever device it moves to.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, cast

import torch


class _Base:
    def __init__(self, params: Iterable[torch.nn.Parameter]) -> None:
        self.params = [p for p in params]

    def bind(self, params: Iterable[torch.nn.Parameter]) -> _Base:
        """Point the optimizer at other parameters of the same shapes (e.g. a shared scratch
        model); its state (moments, step count) stays its own. An unbound optimizer (a copy,
        or one read from a checkpoint) is checked against its moments' shapes where it has them."""
        params = [p for p in params]
        known = [p.shape for p in self.params] or self._moment_shapes()
        if known is not None and [p.shape for p in params] != known:
            raise ValueError("bind: parameter shapes differ")
        self.params = params
        return self

    def _moment_shapes(self) -> list[torch.Size] | None:
        """The shapes of the parameters its moments are for, where it knows them."""
        return None

    def _bound(self) -> list[torch.nn.Parameter]:
        if not self.params:
            raise RuntimeError(f"{type(self).__name__}.step: the optimizer is bound to no parameters (a copy or a "
                               "checkpoint's holds its moments only): bind it to the model it trains first")
        return self.params

    def __getstate__(self) -> dict[str, Any]:
        """Its state without the parameters it updates (copies, pickles, checkpoints, moves)."""
        return {k: v for k, v in self.__dict__.items() if k != "params"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.params = []  # unbound (a checkpoint written before parameters were left out holds them: dropped)

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

    def _moment_shapes(self) -> list[torch.Size] | None:
        return [m.shape for m in self.exp_avg]

    @torch.no_grad()
    def step(self) -> None:
        b1, b2 = self.betas
        params = self._bound()
        self.steps += 1
        bc1 = 1 - b1**self.steps
        bc2_sqrt = math.sqrt(1 - b2**self.steps)
        step_size = self.lr / bc1
        for p, m, v in zip(params, self.exp_avg, self.exp_avg_sq):
            grad = cast(torch.Tensor, p.grad)  # every parameter has one after backward
            g = grad if not self.weight_decay else grad.add(p, alpha=self.weight_decay)
            adam_update_(p, m, v, g, self.betas, self.eps, step_size, bc2_sqrt)


class SGD(_Base):
    """SGD with optional momentum (dampening 0, no Nesterov) and L2 weight decay."""

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        super().__init__(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def _moment_shapes(self) -> list[torch.Size] | None:
        return None if any(b is None for b in self.buffers) else [b.shape for b in self.buffers if b is not None]

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self._bound()):
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
