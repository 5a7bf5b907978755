"""FedEM: federated multi-task learning under a mixture of distributions.

O. Marfoq, G. Neglia, A. Bellet, L. Kameni, R. Vidal, "Federated Multi-Task Learning under a
Mixture of Distributions", NeurIPS 2021 (arXiv:2108.10252); the round as the
reference code (omarfoq/FedEM) implements it (docs/algorithms.md#fedem-aggregation):

* E-step at each sampled client, with the current global learners:
  q_t(z_i = m) = softmax_m(log pi_tm - l(h_m(x_i), y_i));
* M-step for the mixture weights: pi_t = mean_i q_t(., i) (kept by the client across rounds);
* M-step for the learners: for each m, ``train.local_epochs`` epochs of mini-batch training on
  (1/B) sum_i q_t(m, i) l_i (q not renormalised), with the client's persisting optimizer state;
* server: theta_m = sum over ALL clients of (n_t / n) theta_m^(t), where non-sampled clients
  contribute the previous global theta_m (the reference code's reweighting; the maintainer
  confirms it is intended).

Prediction of client t: sum_m pi_tm softmax(h_m(x)) (classification; clamped to [0, 1], loss
NLL) or sum_m pi_tm h_m(x) (regression). Importance weights are pi; evaluation reports the
mixture prediction and, as ``*_best_learner``, the learner with the largest pi_tm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F

from ..devices import to_numpy
from ..optim import SGD, Adam
from ..params import get_flat, set_flat
from ..rng import numpy_rng
from ..training import evaluate, model_losses, outputs
from .base import (
    ClientCall,
    ClientContext,
    Configured,
    Plan,
    Reduction,
    RoundGenerator,
    RoundResult,
    ServerContext,
    Update,
    planned_sum,
)
from .common import scratch_optimizer, select_uniform, train_from
from .settings import FedEMConfig


def e_step(log_pi: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
    """Responsibilities q [M, n] = softmax over m of (log pi_m - losses[m, i])."""
    return torch.softmax(log_pi[:, None] - losses, dim=0)


def m_step_pi(q: torch.Tensor) -> torch.Tensor:
    """pi_m = (1/n) sum_i q[m, i]."""
    return q.mean(dim=1)


def fit_mixture(losses: torch.Tensor, max_iters: int = 500, tol: float = 1e-8) -> tuple[torch.Tensor, int]:
    """The mixture weights of a client with the learners frozen: EM from uniform weights, the
    E-step (:func:`e_step`) and the M-step for pi (:func:`m_step_pi`) alternated on the per-sample
    losses [M, n] until no weight moves by more than ``tol`` (at most ``max_iters`` steps).
    Returns (pi, the steps taken). The maximum-likelihood weights of the mixture
    sum_m pi_m exp(-loss_m), which EM never leaves once there."""
    losses = losses.to(torch.float64)
    pi = torch.full((losses.shape[0],), 1.0 / losses.shape[0], dtype=torch.float64, device=losses.device)
    for step in range(1, max_iters + 1):
        new = m_step_pi(e_step(torch.log(pi.clamp_min(1e-300)), losses))
        if float((new - pi).abs().max()) <= tol:
            return new, step
        pi = new
    return pi, max_iters


@dataclass(frozen=True)
class LearnerAverage(Reduction):
    """theta = sum_{t in S} (n_t/n) theta^(t) + (1 - sum_{t in S} n_t/n) theta^old over the
    clients S whose update is finite, n the total over all clients (the reference code: the
    clients not sampled contribute the old learners). Sums the learners of a client's
    ``Update(learners, {"pi": pi})`` result; every learner at once."""

    sizes: np.ndarray
    old: torch.Tensor

    def plan(self, extras: Mapping[int, Mapping[str, object]]) -> Plan:
        n = float(np.sum(self.sizes))
        share = {k: float(self.sizes[k]) / n for k in sorted(extras)}
        return Plan(self.old * (1.0 - sum(share.values())), {k: (None, p) for k, p in share.items()})


def aggregate_learners(old: torch.Tensor, updates: dict[int, torch.Tensor], sizes: np.ndarray) -> torch.Tensor:
    """theta_m = sum_{t in S} (n_t/n) theta_m^(t) + (1 - sum_{t in S} n_t/n) theta_m^old."""
    return planned_sum(LearnerAverage(sizes, old).plan({k: {} for k in updates}), updates)


@torch.no_grad()
def mixture_metrics(scratch: torch.nn.Module, learners: torch.Tensor, pi: torch.Tensor,
                    x: torch.Tensor, y: torch.Tensor, task: str) -> dict[str, float]:
    """Metrics of the pi-mixture prediction."""
    outs = []
    for vec in learners:
        set_flat(scratch, vec)
        scratch.eval()
        out = outputs(scratch, x)
        outs.append(out if task == "regression" else F.softmax(out, dim=-1))
    mix = sum(w * o for w, o in zip(pi.tolist(), outs))
    if task == "regression":
        return {"mse": float(((mix - y) ** 2).mean())}
    mix = mix.clamp(0.0, 1.0)
    return {"loss": float(F.nll_loss(torch.log(mix.clamp_min(1e-12)), y)),
            "accuracy": float((mix.argmax(-1) == y).float().mean())}


class Mixture(torch.nn.Module):
    """The model FedEM serves a client: its pi-mixture of the learners' predictions (as
    :func:`mixture_metrics` scores it): the mixture for regression, the log of the mixed class
    probabilities for classification (cross-entropy of it is the mixture's log-loss)."""

    def __init__(self, scratch: torch.nn.Module, learners: torch.Tensor, pi: torch.Tensor, task: str) -> None:
        super().__init__()
        self.scratch, self.learners, self.pi, self.task = scratch, learners, pi, task

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mix = None
        for w, vec in zip(self.pi.tolist(), self.learners):
            set_flat(self.scratch, vec)
            self.scratch.eval()
            out = self.scratch(x)
            out = out if self.task == "regression" else F.softmax(out, dim=-1)
            mix = w * out if mix is None else mix + w * out
        assert mix is not None
        return mix if self.task == "regression" else torch.log(mix.clamp(0.0, 1.0).clamp_min(1e-12))


@dataclass
class FedEMClient:
    pi: torch.Tensor  # [M]
    optimizers: list[Adam | SGD]  # one per learner, persisting across rounds
    rounds: int = 0  # rounds this client was sampled (drives the lr milestones)


@dataclass
class FedEMState:
    learners: torch.Tensor  # [M, d]
    pi: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # [N, M], as last reported


def fedem_train(ctx: ClientContext, cs: FedEMClient, payload: Mapping[str, torch.Tensor], t: int):
    """E-step with the current learners, pi = mean of q, each learner trained on its q-weighted
    loss (the lr decayed after ``lr_milestones`` of the client's own rounds)."""
    a = ctx.settings(FedEMConfig)
    learners = payload["learners"]
    losses = model_losses(ctx.scratch, learners, ctx.data.x, ctx.data.y, ctx.info.task)
    q = e_step(torch.log(cs.pi), losses)
    cs.pi = m_step_pi(q)
    lr = ctx.cfg.train.lr * a.lr_decay ** sum(cs.rounds >= m for m in a.lr_milestones)
    new = []
    for m, opt in enumerate(cs.optimizers):
        opt.lr = lr
        new.append(train_from(ctx, opt, learners[m], t, tag=f"shuffle-learner-{m}", sample_weights=q[m]))
    cs.rounds += 1
    return cs, Update(torch.stack(new), {"pi": cs.pi.clone()})


def _fedem_evaluate(ctx: ClientContext, cs: FedEMClient, payload: Mapping[str, torch.Tensor], t: int):
    learners = payload["learners"]
    out = mixture_metrics(ctx.scratch, learners, cs.pi, ctx.data.x, ctx.data.y, ctx.info.task)
    set_flat(ctx.scratch, learners[int(cs.pi.argmax())])
    best = evaluate(ctx.scratch, ctx.data.x, ctx.data.y, ctx.info.task)
    out.update({f"{k}_best_learner": v for k, v in best.items()})
    return cs, out


def _fedem_unseen(ctx: ClientContext, _: None, payload: Mapping[str, torch.Tensor], t: int):
    """Cold start of a held-out client, as FedEM serves clients that did not train: its
    mixture weights fitted by EM on its training data with the learners frozen
    (:func:`fit_mixture`; ``unseen_em_steps`` steps, None: to convergence), the pi-mixture of
    the learners served; pi is the metrics ``pi[m]``, the steps taken ``em_steps``."""
    a = ctx.settings(FedEMConfig)
    learners = payload["learners"]
    losses = model_losses(ctx.scratch, learners, ctx.data.x, ctx.data.y, ctx.info.task)
    pi, steps = fit_mixture(losses) if a.unseen_em_steps is None else fit_mixture(losses, a.unseen_em_steps, 0.0)
    pi = pi.to(torch.float32)
    split = ctx.data.test_split()  # scored as every client_metrics row: on its (own or drawn) test split
    assert split is not None, "the host gives every client a test split"
    out = mixture_metrics(ctx.scratch, learners, pi, split[0], split[1], ctx.info.task)
    out.update({f"pi[{m}]": float(p) for m, p in enumerate(pi.tolist())}, em_steps=float(steps))
    return None, out


class FedEM(Configured[FedEMConfig]):
    Settings = FedEMConfig
    client_ops = {"train": fedem_train, "evaluate": _fedem_evaluate, "unseen": _fedem_unseen}
    stateless_ops = ("unseen",)

    def init_server(self, ctx: ServerContext) -> FedEMState:
        m = self.settings.num_centers
        learners = torch.stack([get_flat(ctx.new_model("center", j)) for j in range(m)])
        return FedEMState(learners, np.full((ctx.num_clients, m), 1.0 / m))

    def init_client(self, ctx: ClientContext) -> FedEMClient:
        m = self.settings.num_centers
        return FedEMClient(torch.full((m,), 1.0 / m, device=ctx.device), [scratch_optimizer(ctx) for _ in range(m)])

    def round(self, ctx: ServerContext, state: FedEMState, t: int) -> RoundGenerator:
        selected = select_uniform(ctx, self.settings.clients_per_round, numpy_rng(ctx.cfg.seed, "select", t))
        res = yield ClientCall("train", selected, {"learners": state.learners},
                               reduce=LearnerAverage(ctx.pool_sizes, state.learners))  # n: the training clients
        pi = state.pi.copy()
        learners = res.value
        for k, e in res.extras.items():
            pi[k] = to_numpy(cast(torch.Tensor, e["pi"]))
        return RoundResult(FedEMState(learners, pi), weights_updated=True, trained=len(selected))

    def centers(self, state: FedEMState) -> torch.Tensor:
        return state.learners

    def weights(self, state: FedEMState) -> np.ndarray:
        return state.pi

    def eval_payload(self, state: FedEMState) -> dict[str, torch.Tensor]:
        return {"learners": state.learners}

    def serve(self, ctx: ClientContext, cs: FedEMClient, payload: Mapping[str, torch.Tensor],
              t: int) -> torch.nn.Module:
        """The model served to a client: its pi-mixture of the learners (:class:`Mixture`)."""
        return Mixture(ctx.scratch, payload["learners"], cs.pi, ctx.info.task)
