"""The RoundCoordinator over a fake executor and a one-call algorithm (tests/support/fakes.py): what
reaches the algorithm, NaN policy, reductions in the actors or here, late clients, the
evaluation schedule, weights, checkpoints, restore and recovery. No Ray, no client training."""

import math

import numpy as np
import pytest
import torch
from support.configs import small_config
from support.fakes import FakeExecutor, OneCall

from raysoft.algorithms import Plan, Reduced, Reduction, WeightedMean
from raysoft.algorithms.base import Update
from raysoft.config import parse_config
from raysoft.errors import ClientFailure, PluginFailure, UpdateError
from raysoft.runtime.checkpoint import load_checkpoint
from raysoft.runtime.rounds import RoundCoordinator

NAN = float("nan")
# hand-chosen updates of clients 0, 1, 2 and sizes n = 1, 3, 3: without client 1 (or without
# client 2) the mean is 1/4 * [4, 8] + 3/4 * [8, 4] = [7, 5], exactly in float32
UPDATES = {0: [4.0, 8.0], 1: [8.0, 4.0], 2: [8.0, 4.0]}
SIZES = np.array([1.0, 3.0, 3.0])
MEAN = torch.tensor([7.0, 5.0])


def updates(bad: dict[int, float] | None = None):
    """The train op of the fake: UPDATES, with client k's update filled with ``bad[k]``."""
    bad = bad or {}
    return lambda k, payload, t: torch.full((2,), bad[k]) if k in bad else torch.tensor(UPDATES[k])


def coordinator(executor, algo=None, run_dir=None, **sections) -> RoundCoordinator:
    """A coordinator of ``algo`` (default OneCall()) over the small config with ``sections``."""
    cfg = parse_config(small_config(**sections))
    return RoundCoordinator(cfg, executor, algo or OneCall(), "run", None if run_dir is None else str(run_dir))


def advance(coord: RoundCoordinator, steps: int) -> list[dict]:
    """The initial evaluation (if not done yet), then ``steps`` rounds; the infos."""
    return [coord.advance() for _ in range(steps + (not coord.started))]


def events(coord: RoundCoordinator) -> list[tuple]:
    ev = coord.recorder.columns["events"]
    return list(zip(ev["kind"], ev["step"], ev["client"]))


def received(coord: RoundCoordinator, t: int) -> dict:
    """What the algorithm's call of round t received (a dict of results or a Reduced)."""
    return coord.state["seen"][t]


# ---------------------------------------------------------------- what reaches the algorithm
def test_the_results_reach_the_algorithm_by_client_with_the_call_s_payload():
    ex = FakeExecutor({"train": lambda k, payload, t: torch.tensor([10.0 * k + payload["x"]])})
    coord = coordinator(ex)
    advance(coord, 2)
    assert [e[1:] for e in ex.asked("call") if e[1] == "train"] == [
        ("train", [0, 1, 2], {"x": 0}, 0), ("train", [0, 1, 2], {"x": 1}, 1)]
    got = received(coord, 1)
    assert list(got) == [0, 1, 2]
    assert [float(v) for v in got.values()] == [1.0, 11.0, 21.0]
    assert events(coord) == []


def test_results_reach_the_algorithm_in_client_order_whatever_order_the_executor_answers_in():
    class Reversed(FakeExecutor):
        def call(self, op, client_ids, payload, t):
            return dict(reversed(list(super().call(op, client_ids, payload, t).items())))

    coord = coordinator(Reversed({"train": updates()}))
    advance(coord, 1)
    assert list(received(coord, 0)) == [0, 1, 2]


# ---------------------------------------------------------------- non-finite updates
@pytest.mark.parametrize("bad", [NAN, math.inf, -math.inf])
def test_a_non_finite_update_is_reported_and_excluded(bad):
    coord = coordinator(FakeExecutor({"train": updates({1: bad})}), train={"nan_policy": "exclude"})
    advance(coord, 1)
    got = received(coord, 0)
    assert list(got) == [0, 2] and torch.equal(got[2], torch.tensor(UPDATES[2]))
    assert events(coord) == [("nan_update", 0, 1)]
    assert coord.recorder.columns["events"]["detail"] == ["op train: non-finite update"]


@pytest.mark.parametrize("reduce_in_actors", [None, True, False])  # None: a call without reduction
def test_a_non_finite_update_stops_the_run_with_nan_policy_stop(reduce_in_actors):
    algorithm = OneCall(reduce=None if reduce_in_actors is None else WeightedMean(SIZES))
    ex = FakeExecutor({"train": updates({1: NAN})})
    coord = coordinator(ex, algorithm, train={"nan_policy": "stop"}, ray={"reduce_in_actors": bool(reduce_in_actors)})
    coord.advance()
    with pytest.raises(UpdateError, match="round 0: client 1 returned a non-finite update"):
        coord.advance()
    assert events(coord) == [("nan_update", 0, 1)]
    assert coord.round == 0 and coord.state["seen"] == []
    assert ex.asked("accumulate") == []


# ---------------------------------------------------------------- reductions
@pytest.mark.parametrize("reduce_in_actors", [True, False])
def test_a_weighted_mean_over_the_finite_updates_in_the_actors_or_here(reduce_in_actors):
    ex = FakeExecutor({"train": updates({1: NAN})})
    coord = coordinator(ex, OneCall(reduce=WeightedMean(SIZES)), train={"nan_policy": "exclude"},
                        ray={"reduce_in_actors": reduce_in_actors})
    advance(coord, 1)
    asked = [e for e in ex.log if e[0] != "call" or e[1] != "evaluate"]
    if reduce_in_actors:  # keep where the clients run, then the plan n_k / sum n over clients 0 and 2
        assert [e[0] for e in asked] == ["call_for_reduction", "accumulate"]
        assert asked[0][1:] == ("train", [0, 1, 2], {"x": 0}, 0)
        plan = asked[1][1]
        assert plan.start is None and plan.terms == {0: (None, 0.25), 2: (None, 0.75)}
    else:  # every update comes here and is summed here
        assert asked == [("call", "train", [0, 1, 2], {"x": 0}, 0)]
    got = received(coord, 0)
    assert isinstance(got, Reduced)
    assert torch.equal(got.value, MEAN)
    assert got.clients == [0, 2] and got.extras == {0: {}, 2: {}}  # plain tensors: no extras
    assert events(coord) == [("nan_update", 0, 1)]


@pytest.mark.parametrize("reduce_in_actors", [True, False])
def test_a_reduction_with_no_finite_update_is_empty_and_nothing_is_accumulated(reduce_in_actors):
    ex = FakeExecutor({"train": updates({0: NAN, 1: NAN, 2: NAN})})
    coord = coordinator(ex, OneCall(reduce=WeightedMean(SIZES)), train={"nan_policy": "exclude"},
                        ray={"reduce_in_actors": reduce_in_actors})
    advance(coord, 1)
    got = received(coord, 0)
    assert got.value is None and got.clients == [] and got.extras == {}
    assert ex.asked("accumulate") == []
    assert [e[:3] for e in events(coord)] == [("nan_update", 0, k) for k in range(3)]


class ByRow(Reduction):
    """Each client's summed tensor added to the row of a 2-row sum that its extra ``row`` names."""

    def plan(self, extras):
        return Plan(torch.zeros(2, 2), {k: (int(e["row"]), 1.0) for k, e in sorted(extras.items())})


def tagged(k, payload, t):
    """An Update: client k's update, summed into row k % 2, with a note that is not summed."""
    return Update(torch.tensor(UPDATES[k]), {"row": k % 2, "note": f"client {k}"})


@pytest.mark.parametrize("reduce_in_actors", [True, False])
def test_an_update_s_extras_reach_the_plan_and_the_round_by_name(reduce_in_actors):
    ex = FakeExecutor({"train": tagged})
    coord = coordinator(ex, OneCall(reduce=ByRow()), ray={"reduce_in_actors": reduce_in_actors})
    advance(coord, 1)
    got = received(coord, 0)
    assert torch.equal(got.value, torch.tensor([[12.0, 12.0], [8.0, 4.0]]))  # rows: clients 0 + 2, client 1
    assert got.extras == {k: {"row": k % 2, "note": f"client {k}"} for k in (0, 1, 2)}


@pytest.mark.parametrize("reduce_in_actors", [True, False])
def test_a_tuple_returned_to_a_reduced_call_is_one_line_saying_what_to_return(reduce_in_actors):
    ex = FakeExecutor({"train": lambda k, payload, t: (torch.tensor(UPDATES[k]), k)})
    coord = coordinator(ex, OneCall(reduce=WeightedMean(SIZES)), ray={"reduce_in_actors": reduce_in_actors})
    with pytest.raises(PluginFailure) as err:
        advance(coord, 1)
    assert str(err.value) == ("client op 'train' returned a tuple to a reduced call: return "
                              "raysoft.sdk.Update(summed=..., extras={...}) (or a tensor)")


# ---------------------------------------------------------------- late clients
@pytest.mark.parametrize("reduce", [False, True])
def test_late_clients_become_late_update_events_and_are_left_out(reduce):
    ex = FakeExecutor({"train": updates()}, late=[2])
    coord = coordinator(ex, OneCall(reduce=WeightedMean(SIZES) if reduce else None))
    advance(coord, 1)
    assert events(coord) == [("late_update", 0, 2)]
    assert coord.recorder.columns["events"]["detail"] == ["op train: missed the round deadline"]
    got = received(coord, 0)
    if reduce:
        assert got.clients == [0, 1] and torch.equal(got.value, MEAN)
    else:
        assert list(got) == [0, 1]


# ---------------------------------------------------------------- the schedule
def test_evaluation_at_round_0_every_eval_every_rounds_and_at_the_last_and_done_after_rounds():
    ex = FakeExecutor({"train": updates()})
    coord = coordinator(ex, algorithm={"rounds": 5, "eval_every": 2})
    infos = advance(coord, 5)
    assert [i["round"] for i in infos] == [0, 1, 2, 3, 4, 5]
    assert [i["done"] for i in infos] == [False] * 5 + [True]
    assert [i["headline"] is not None for i in infos] == [True, False, True, False, True, True]
    evaluations = [e for e in ex.asked("call") if e[1] == "evaluate"]
    assert [(e[2], e[3], e[4]) for e in evaluations] == [(list(range(10)), {"t": t}, t) for t in (0, 2, 4, 5)]
    # the clients' results (100 t + k) are recorded as they came, and their mean is the headline's
    m = coord.recorder.columns["metrics"]
    rows = [(s, e, v) for s, e, sc, v in zip(m["step"], m["entity"], m["scope"], m["value"]) if sc == "client"]
    assert rows == [(t, k, 100.0 * t + k) for t in (0, 2, 4, 5) for k in range(10)]
    assert infos[2]["headline"]["local models mse"] == 204.5
    assert list(infos[2]["headline"])[:2] == ["best center mse dist 0", "dist 1"]  # it said mse[0], mse[1]
    # every center on both holdout sets at each evaluation
    cluster = {s for s, sc in zip(m["step"], m["scope"]) if sc == "cluster"}
    assert cluster == {0, 2, 4, 5}
    assert coord.summary()["rounds"] == 5


def test_weights_are_recorded_for_the_round_that_updated_them():
    coord = coordinator(FakeExecutor({"train": updates()}))
    advance(coord, 2)
    w = coord.recorder.columns["weights"]
    rows = list(zip(w["step"], w["client"], w["center"], w["estimate"]))
    assert rows == [(t, k, c, k / 10 if c == 0 else 1 - k / 10) for t in (0, 1) for k in range(10) for c in (0, 1)]


# ---------------------------------------------------------------- checkpoints
TABLES = ("metrics", "weights", "clients", "events")


def snapshot(coord: RoundCoordinator) -> dict:
    """The recorded rows without the wall-clock column."""
    return {name: {c: list(v) for c, v in coord.recorder.columns[name].items() if c != "time_s"} for name in TABLES}


def test_a_checkpoint_brings_back_the_round_the_state_the_clients_and_the_rows(tmp_path):
    ex = FakeExecutor({"train": lambda k, payload, t: torch.tensor([float(k + t)])})
    ex.states = {k: f"client {k} at round 2" for k in range(10)}
    coord = coordinator(ex, run_dir=tmp_path, output={"checkpoint_every": 2})
    advance(coord, 2)
    assert (tmp_path / "checkpoint.pt").exists() and (tmp_path / "metrics.parquet").exists()
    rows, seen = snapshot(coord), coord.state["seen"]
    ex.states = {k: "later" for k in range(10)}
    advance(coord, 1)
    assert coord.round == 3 and len(coord.state["seen"]) == 3
    coord.restore(load_checkpoint(tmp_path))
    assert coord.round == 2 and coord.started
    assert [list(s) for s in coord.state["seen"]] == [list(s) for s in seen]
    assert all(torch.equal(a[k], b[k]) for a, b in zip(coord.state["seen"], seen) for k in a)
    assert ex.states == {k: f"client {k} at round 2" for k in range(10)}
    for name in ("metrics", "weights", "clients"):
        assert snapshot(coord)[name] == rows[name], name


def test_a_run_resumed_from_its_checkpoint_ends_with_the_rows_of_an_uninterrupted_one(tmp_path):
    def run(run_dir, stop_at=None):
        run_dir.mkdir(exist_ok=True)
        coord = coordinator(FakeExecutor({"train": updates()}), run_dir=run_dir,
                            algorithm={"rounds": 5, "eval_every": 2}, output={"checkpoint_every": 2})
        if stop_at is None:
            coord.resume()
        while not coord.advance()["done"] and coord.round != stop_at:
            pass
        return coord

    clean = run(tmp_path / "clean")
    stopped = run(tmp_path / "resumed", stop_at=3)
    assert stopped.round == 3
    resumed = run(tmp_path / "resumed")
    assert resumed.round == 5 and resumed.done()
    for name in ("metrics", "weights", "clients"):
        assert snapshot(resumed)[name] == snapshot(clean)[name], name


def failing_once(at_round: int):
    """A train op whose executor dies (ClientFailure) at its first call of round ``at_round``."""
    failed: list[int] = []

    def train(k, payload, t):
        if t == at_round and not failed:
            failed.append(k)
            raise ClientFailure("actor died")
        return torch.tensor([float(k + t)])

    return train


@pytest.mark.parametrize("checkpoint_every", [0, 2])
def test_a_dead_executor_is_recovered_from_the_last_checkpoint_or_from_the_start(tmp_path, checkpoint_every):
    ex = FakeExecutor({"train": failing_once(at_round=3)})
    coord = coordinator(ex, run_dir=tmp_path, output={"checkpoint_every": checkpoint_every})
    advance(coord, 3)
    info = coord.advance()
    back = 2 if checkpoint_every else 0
    said = info.pop("events")  # what the driver says on stderr, as it happens
    assert [e["kind"] for e in said] == ["actor_died", "restored"]
    assert info == {"round": back, "headline": None, "done": False}
    assert coord.round == back and len(coord.state["seen"]) == back
    assert coord.started == bool(checkpoint_every)  # from the start: the initial evaluation again
    assert ("recover",) in ex.log and (("set_states", {}) in ex.log) == bool(checkpoint_every)
    assert (("reset",) in ex.log) != bool(checkpoint_every)
    kinds = [(kind, step) for kind, step, _ in events(coord)]
    assert kinds[-2:] == [("actor_died", 3), ("restored", back)]
    assert coord.recorder.columns["events"]["detail"][-1] == f"continuing from round {back}"
    while not coord.advance()["done"]:
        pass
    assert coord.round == 4 and len(coord.state["seen"]) == 4


def test_recovery_records_each_event_once(tmp_path):
    coord = coordinator(FakeExecutor({"train": failing_once(at_round=3)}), run_dir=tmp_path,
                        output={"checkpoint_every": 2})
    advance(coord, 4)
    assert [(kind, step) for kind, step, _ in events(coord)] == [
        ("checkpoint", 2), ("actor_died", 3), ("restored", 2)]


@pytest.mark.parametrize("in_actors", [True, False])
def test_a_round_reports_the_coordinators_busy_seconds_and_bytes(in_actors):
    """FedAvg's round 1, K = 6 clients, d parameters of float32: the broadcast model (4d bytes)
    goes out once; with the sum in the actors one 4d-byte sum comes back, else K updates."""
    from raysoft.backends import run_backend
    from raysoft.config import parse_config
    from raysoft.data import Federation
    from raysoft.models import build_model
    from raysoft.params import get_flat

    cfg = parse_config(small_config(algorithm={"name": "fedavg", "rounds": 3, "clients_per_round": 6, "eval_every": 3},
                                    ray={"reduce_in_actors": in_actors}))
    infos = []
    run_backend(cfg, "t", infos.append)
    d = get_flat(build_model(cfg.model, Federation(cfg.data, cfg.seed).info)).numel()
    second = next(i for i in infos if i.get("round") == 2)  # after round index 1, no evaluation
    assert second["coordinator_bytes"] == 4 * d * (2 if in_actors else 1 + 6)
    assert second["coordinator_busy_s"] >= 0.0


def test_recovery_that_keeps_failing_stops_the_run_in_one_line_of_the_family(monkeypatch):
    import raysoft.runtime.recording
    from raysoft.errors import RecoveryFailure, exit_code

    class Dying(FakeExecutor):
        def recover(self) -> None:
            super().recover()
            raise ClientFailure("client actor 1 died\n(its node left)")

    monkeypatch.setattr(raysoft.runtime.recording.time, "sleep", lambda s: None)
    ex = Dying()
    coord = coordinator(ex)
    with pytest.raises(RecoveryFailure) as err:
        coord.recover(attempts=3)
    assert str(err.value) == ("could not recover the client actors after 3 attempts (the last: client actor 1 died "
                              "(its node left))")
    assert exit_code(err.value) == 1 and ex.asked("recover") == [("recover",)] * 3
