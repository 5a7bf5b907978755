"""Flat-parameter operations: models travel and are averaged as 1-D float32 tensors.

A center, a client's local model or a learner is a ``Params`` vector of length d (the
model's parameter count, in ``model.parameters()`` order). Stacks of them are ``[m, d]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

Params = torch.Tensor  # 1-D float32, length d
ClientId = int
ClusterId = int


def get_flat(model: nn.Module) -> Params:
    """A detached copy of the model's parameters as one vector."""
    # reshape, not parameters_to_vector's view: a channels_last weight is not contiguous; the
    # vector is in the logical (C, H, W) order whatever the memory format
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def set_flat(model: nn.Module, vec: Params) -> None:
    """Copy ``vec`` into the model's parameters, in place. A copy, not
    ``torch.nn.utils.vector_to_parameters``, which makes the parameters *views* of ``vec``:
    training the model would then write into ``vec`` (a center of a broadcast payload shared by
    every client of a host, or the server's own state in-process)."""
    i = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(vec[i : i + n].view_as(p))
            i += n
    if i != vec.numel():
        raise ValueError(f"a vector of {vec.numel()} values for a model of {i} parameters")


def views_like(vec: Params, model: nn.Module) -> list[torch.Tensor]:
    """Views of ``vec`` shaped like each parameter of ``model`` (no copy)."""
    out, i = [], 0
    for p in model.parameters():
        out.append(vec[i : i + p.numel()].view_as(p))
        i += p.numel()
    return out


def weighted_sum(vectors: Sequence[Params] | torch.Tensor, weights: Sequence[float]) -> Params:
    """sum_i weights[i] * vectors[i], accumulated in the given order (deterministic)."""
    if len(vectors) != len(weights):
        raise ValueError(f"{len(vectors)} vectors but {len(weights)} weights")
    if len(vectors) == 0:
        raise ValueError("weighted_sum of no vectors")
    return add_terms({i: (None, float(w)) for i, w in enumerate(weights)}, dict(enumerate(vectors)), None)


Term = tuple[int | None, float]


def add_terms(terms: Mapping[int, Term | list[Term]], parts: Mapping[int, torch.Tensor],
              acc: torch.Tensor | None) -> torch.Tensor:
    """acc[row] += coef * parts[k] for each (k: (row, coef)) of ``terms`` in ascending k (the
    whole acc when row is None; zeros like the first part if ``acc`` is None), in place: the
    one chain of additions (``weighted_sum`` is its case of a whole-vector term per vector), so
    a sum split over hosts in id order is the same. A
    client's term may be a list of (row, coef): its part is added to each of those rows (a
    FedSoft client selected by several centers), so every row still gets its terms in
    ascending k."""
    for k in sorted(terms):
        spec = terms[k]
        for row, coef in spec if isinstance(spec, list) else [spec]:
            if acc is None:
                acc = torch.zeros_like(parts[k])
            (acc if row is None else acc[row]).add_(parts[k], alpha=float(coef))
    if acc is None:
        raise ValueError("add_terms: no terms and no start")
    return acc


def mean(vectors: Sequence[Params]) -> Params:
    """The uniform average of the vectors, accumulated in order."""
    return weighted_sum(vectors, [1.0 / len(vectors)] * len(vectors))
