"""FaultInjector around a fake executor (tests/support/fakes.py), slowdown and poison by hand."""

import numpy as np
import pytest
import torch
from support.fakes import FakeExecutor

from raysoft.algorithms import Plan
from raysoft.algorithms.base import Update
from raysoft.config import Fault
from raysoft.runtime.faults import FaultInjector, poison, slowdown

CLIENTS = [0, 1, 2, 3]


def vector(k, payload, t):
    return torch.tensor([float(k), float(t)])


def pair(k, payload, t):
    """An Update: the summed tensor and a small named extra."""
    return Update(torch.tensor([float(k)]), {"tag": torch.tensor([10.0 * k])})


def injector(*faults: Fault) -> tuple[FaultInjector, list[tuple]]:
    """A FaultInjector over a FakeExecutor; the events it reports."""
    fi = FaultInjector(FakeExecutor({"train": vector, "estimate": vector, "pair": pair}), faults)
    reported: list[tuple] = []
    fi.on_event = lambda *a, **k: reported.append((a, k))
    return fi, reported


def kills(fi: FaultInjector) -> list[int]:
    return [e[1] for e in fi.inner.log if e[0] == "kill"]


def kinds(fi: FaultInjector) -> list[str]:
    """The inner executor's log as "kill <actor>" and "<method> <op> <t>"."""
    return [f"kill {e[1]}" if e[0] == "kill" else f"{e[0]} {e[1]} {e[4]}" for e in fi.inner.log]


# ---------------------------------------------------------------- kill_actor
@pytest.mark.parametrize("method", ["call", "call_for_reduction"])
def test_a_kill_fires_once_before_the_first_non_evaluate_call_of_its_round(method):
    fi, reported = injector(Fault(kind="kill_actor", at_round=2, actor=1))
    fi.inner.results["evaluate"] = vector  # a tensor, which a reduced call may sum
    run = (lambda op, t: fi.call(op, CLIENTS, {}, t)) if method == "call" else \
          (lambda op, t: fi.call_for_reduction(op, CLIENTS, {}, t))
    for t in (0, 1):
        run("train", t)
    run("evaluate", 2)  # a round's evaluation is not its first client call
    run("train", 2)
    run("estimate", 2)
    run("train", 3)
    assert kinds(fi) == [f"{method} train 0", f"{method} train 1", f"{method} evaluate 2", "kill 1",
                         f"{method} train 2", f"{method} estimate 2", f"{method} train 3"]
    assert reported == [(("fault_injected", "kill actor 1"), {"actor": 1})]


def test_a_kill_never_fires_on_evaluate():
    fi, reported = injector(Fault(kind="kill_actor", at_round=1))
    for t in (0, 1, 2):
        fi.call("evaluate", CLIENTS, {}, t)
    assert kills(fi) == [] and reported == []


def test_a_kill_is_not_fired_again_after_a_restore_to_an_earlier_round():
    fi, reported = injector(Fault(kind="kill_actor", at_round=2, actor=0))
    for t in (0, 1, 2):
        fi.call("train", CLIENTS, {}, t)
    for t in (1, 2, 3):  # the coordinator restored round 1 and runs rounds 1 and 2 again
        fi.call("train", CLIENTS, {}, t)
    assert kills(fi) == [0] and len(reported) == 1


def test_two_kills_of_one_round_both_fire_in_order():
    fi, reported = injector(
        Fault(kind="kill_actor", at_round=1, actor=3), Fault(kind="kill_actor", at_round=1, actor=0)
    )
    fi.call("train", CLIENTS, {}, 1)
    fi.call("train", CLIENTS, {}, 1)
    assert kinds(fi) == ["kill 3", "kill 0", "call train 1", "call train 1"]
    assert [r[1]["actor"] for r in reported] == [3, 0]


# ---------------------------------------------------------------- nan_update
def test_a_nan_update_poisons_only_its_client_s_train_result_of_its_round():
    fi, reported = injector(Fault(kind="nan_update", at_round=1, client=2))
    out = fi.call("train", CLIENTS, {}, 1)
    assert list(out) == CLIENTS
    assert torch.isnan(out[2]).all() and out[2].shape == (2,)
    assert all(torch.equal(out[k], vector(k, {}, 1)) for k in (0, 1, 3))
    for op, t in (("train", 0), ("train", 2), ("evaluate", 1), ("estimate", 1)):
        res = fi.call(op, CLIENTS, {}, t)
        if op != "evaluate":
            assert all(torch.equal(res[k], vector(k, {}, t)) for k in CLIENTS), (op, t)
        else:
            assert res[2] == {"mse": 102.0}
    assert reported == []  # the coordinator reports the non-finite update, not the injector


def test_a_nan_update_of_a_client_not_asked_changes_nothing():
    fi, _ = injector(Fault(kind="nan_update", at_round=0, client=7))
    out = fi.call("train", CLIENTS, {}, 0)
    assert list(out) == CLIENTS and all(torch.equal(out[k], vector(k, {}, 0)) for k in CLIENTS)


def test_a_nan_update_makes_keep_report_its_client_not_finite():
    fi, _ = injector(Fault(kind="nan_update", at_round=1, client=2))
    fi.inner.results["train"] = pair
    flags = fi.call_for_reduction("train", CLIENTS, {}, 1)
    assert [k for k in flags if not flags[k][0]] == [2]
    _, extras, sent = flags[2]
    assert sent == flags[1][2] == 8  # a poisoned update was still sent: its bytes stay (summed + extras)
    assert list(extras) == ["tag"] and torch.isnan(extras["tag"]).all()
    assert flags[1][0] and torch.equal(flags[1][1]["tag"], torch.tensor([10.0]))
    other = fi.call_for_reduction("train", CLIENTS, {}, 2)  # another round: untouched
    assert all(ok for ok, _, _ in other.values())


# ---------------------------------------------------------------- slowdown and poison
def test_slowdown_by_hand():
    faults = [Fault(kind="slow_client", at_round=2, client=1, factor=3.0),
              Fault(kind="slow_client", at_round=4, client=1, factor=5.0),
              Fault(kind="slow_client", at_round=4, client=1, factor=2.0),
              Fault(kind="slow_client", at_round=0, client=2, factor=1.5),
              Fault(kind="kill_actor", at_round=0, actor=1), Fault(kind="nan_update", at_round=0, client=1)]
    got = {(k, t): slowdown(faults, k, t) for k in (0, 1, 2) for t in (0, 1, 2, 3, 4, 9)}
    assert got == {**{(0, t): 1.0 for t in (0, 1, 2, 3, 4, 9)},
                   (1, 0): 1.0, (1, 1): 1.0, (1, 2): 3.0, (1, 3): 3.0, (1, 4): 5.0, (1, 9): 5.0,
                   **{(2, t): 1.5 for t in (0, 1, 2, 3, 4, 9)}}
    assert slowdown([], 0, 0) == 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_poison_fills_float_tensors_with_nan(dtype):
    x = torch.ones(2, 3, dtype=dtype)
    p = poison(x)
    assert p.shape == (2, 3) and p.dtype == dtype and torch.isnan(p).all()
    assert torch.equal(x, torch.ones(2, 3, dtype=dtype))  # a new tensor


def test_poison_fills_float_arrays_with_nan_and_leaves_the_rest():
    a = np.arange(4, dtype=np.float32)
    p = poison(a)
    assert p.dtype == np.float32 and p.shape == (4,) and np.isnan(p).all()
    assert np.array_equal(a, np.arange(4))
    ints, itensor = np.arange(3), torch.arange(3)
    assert poison(ints) is ints and poison(itensor) is itensor
    assert poison(7) == 7 and poison(None) is None and poison("x") == "x"


def test_poison_keeps_the_shape_and_type_of_tuples_and_lists():
    out = poison((torch.ones(2), 3, (np.ones(2), torch.arange(2)), [torch.zeros(1)]))
    assert type(out) is tuple and len(out) == 4
    assert torch.isnan(out[0]).all() and out[1] == 3
    assert type(out[2]) is tuple and np.isnan(out[2][0]).all() and torch.equal(out[2][1], torch.arange(2))
    assert type(out[3]) is list and torch.isnan(out[3][0]).all()


# ---------------------------------------------------------------- delegation
def test_what_the_injector_does_not_change_is_the_inner_executor_s():
    fi, _ = injector()
    inner = fi.inner
    inner.placement = [{"clients": [0, 1], "node_id": "n", "device": "cpu"}]
    inner.late = [3]
    inner.states = {0: "s0"}
    assert fi.placement is inner.placement and fi.late == [3]
    assert fi.get_states() == {0: "s0"}
    fi.set_states({1: "s1"})
    fi.reset()
    fi.recover()
    assert [e[0] for e in inner.log] == ["set_states", "reset", "recover"]
    fi.call_for_reduction("train", [0, 1], {}, 0)
    # 1 * [0, 0] + 2 * [1, 0]
    assert torch.equal(fi.accumulate(Plan(None, {0: (None, 1.0), 1: (None, 2.0)})), torch.tensor([2.0, 0.0]))
    with pytest.raises(AttributeError):
        _ = fi.no_such_attribute


def test_no_faults_changes_nothing():
    fi, reported = injector()
    assert torch.equal(fi.call("train", [1], {}, 0)[1], vector(1, {}, 0))
    assert fi.call_for_reduction("train", [1], {}, 0) == {1: (True, {}, 8)}  # [1, 0] as float32
    assert kills(fi) == [] and reported == []
