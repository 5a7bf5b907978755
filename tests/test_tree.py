"""raysoft.tree: one definition of a container (dicts, lists, tuples, named tuples, dataclasses)
for every walker, and the walkers that use it agree on it."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import torch

from raysoft.devices import to_device
from raysoft.runtime.executor import finite
from raysoft.runtime.faults import poison
from raysoft.runtime.rounds import nbytes
from raysoft.tree import leaves, map_leaves

Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Update:
    delta: torch.Tensor
    count: int
    extra: dict = dataclasses.field(default_factory=dict)


def nested():
    return {"w": [torch.ones(3), (np.zeros(2), 7)], "u": Update(torch.full((2, 2), 2.0), 5, {"m": np.ones(4)}),
            "p": Pair(1.5, torch.arange(3))}


def test_leaves_in_order_and_map_keeps_the_containers():
    obj = nested()
    names = [type(x).__name__ for x in leaves(obj)]
    assert names == ["Tensor", "ndarray", "int", "Tensor", "int", "ndarray", "float", "Tensor"]
    doubled = map_leaves(lambda x: x * 2, obj)
    assert isinstance(doubled["w"], list) and isinstance(doubled["w"][1], tuple)
    assert isinstance(doubled["u"], Update) and doubled["u"].count == 10
    assert isinstance(doubled["p"], Pair) and doubled["p"].a == 3.0
    assert torch.equal(doubled["u"].delta, torch.full((2, 2), 4.0))
    np.testing.assert_array_equal(doubled["u"].extra["m"], np.full(4, 2.0))
    assert obj["u"].count == 5  # the input is not changed
    assert map_leaves(lambda x: x, obj) is obj  # nothing changed: nothing copied
    ints_doubled = map_leaves(lambda x: x * 2 if isinstance(x, int) else x, obj)
    assert ints_doubled["p"] is obj["p"] and ints_doubled["u"] is not obj["u"]  # only where a leaf changed


def test_the_walkers_agree_on_dicts_and_dataclasses():
    obj = nested()
    # float32 (4 bytes) and float64 (8) arrays and an int64 tensor (8), counted in every container
    assert nbytes(obj) == 3 * 4 + 2 * 8 + 4 * 4 + 4 * 8 + 3 * 8
    assert finite(obj)
    bad = poison(obj)
    assert not finite(bad)
    # every float tensor and array is NaN, inside the dict and the dataclass too; ints untouched
    assert torch.isnan(bad["u"].delta).all() and np.isnan(bad["u"].extra["m"]).all()
    assert np.isnan(bad["w"][1][0]).all() and torch.equal(bad["p"].b, torch.arange(3))
    assert not finite({"only": Update(torch.tensor([float("inf")]), 1)})
    moved = to_device(obj, torch.device("cpu"))
    assert isinstance(moved["u"], Update) and torch.equal(moved["u"].delta, obj["u"].delta)


def test_an_overflowing_sum_of_finite_values_is_still_finite():
    big = torch.full((4,), 3e38)  # the sum overflows float32; every element is finite
    assert finite([big]) and not finite([torch.cat([big, torch.tensor([float("nan")])])])
