"""The simulated clock of synchronous rounds (``clock:``): speeds, durations, the per-client
deadline decided in simulated time, and its reproducibility."""

import numpy as np
import pandas as pd
import pytest
from support.configs import small_config
from support.runs import values as _values

import raysoft
from raysoft.config import ClockConfig, ConfigError, Fault, parse_config
from raysoft.errors import DataFileError, MissingDataError
from raysoft.runtime.clock import RoundClock, client_speeds, read_speeds


def _clock(**keys) -> ClockConfig:
    return ClockConfig(**{"speeds": "equal", **keys})


# --------------------------------------------------------------------------- by hand
def test_durations_by_hand():
    # samples x epochs x seconds_per_sample / speed x slowdown: 40 x 2 x 0.01 = 0.8, 60 x 2 x 0.01 = 1.2
    slow = [Fault(kind="slow_client", at_round=1, client=1, factor=3.0)]
    c = RoundClock(_clock(), [40, 60], local_epochs=2, faults=slow, seed=0)
    assert c.duration(0, 0) == pytest.approx(0.8) and c.duration(1, 0) == pytest.approx(1.2)
    assert c.duration(1, 1) == pytest.approx(3.6) and c.duration(0, 5) == pytest.approx(0.8)


def test_a_round_lasts_until_its_slowest_client_or_its_deadline():
    c = RoundClock(_clock(round_deadline_s=1.0), [40, 60, 30], local_epochs=2, faults=[], seed=0)
    on_time, late = c.split([0, 1, 2], t=0)
    assert on_time == [0, 2] and late == {1: pytest.approx(1.2)}
    c.end_round()
    assert c.now == pytest.approx(1.0)  # a late client: the round waited until its deadline
    on_time, late = c.split([0, 2], t=1)
    assert on_time == [0, 2] and late == {}
    c.end_round()
    assert c.now == pytest.approx(1.8)  # all on time: until the slowest (0.8)


def test_no_deadline_times_the_rounds_and_leaves_no_one_out():
    c = RoundClock(_clock(), [40, 60], local_epochs=1, faults=[], seed=0)
    assert c.split([0, 1], 0) == ([0, 1], {})
    c.end_round()
    assert c.now == pytest.approx(0.6)


def test_lognormal_speeds_come_from_the_seed():
    a = client_speeds(_clock(speeds="lognormal", sigma=0.5), 50, seed=1)
    assert np.array_equal(a, client_speeds(_clock(speeds="lognormal", sigma=0.5), 50, seed=1))
    assert not np.array_equal(a, client_speeds(_clock(speeds="lognormal", sigma=0.5), 50, seed=2))
    assert np.all(a > 0) and 0.2 < np.log(a).std() < 0.8
    assert np.array_equal(client_speeds(_clock(speeds="lognormal", sigma=0.0), 5, seed=1), np.ones(5))


def test_jitter_varies_by_round_and_client_and_repeats():
    c = RoundClock(_clock(jitter=0.5), [50, 50], local_epochs=1, faults=[], seed=4)
    d = [[c.duration(k, t) for t in range(3)] for k in range(2)]
    assert len({round(x, 12) for row in d for x in row}) == 6
    again = RoundClock(_clock(jitter=0.5), [50, 50], local_epochs=1, faults=[], seed=4)
    assert d == [[again.duration(k, t) for t in range(3)] for k in range(2)]


# --------------------------------------------------------------------------- the speeds file
def test_a_speeds_file_is_read(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("client,speed\n1,0.5\n0,2\n")
    assert read_speeds(str(p), 2).tolist() == [2.0, 0.5]


@pytest.mark.parametrize("text, message", [
    ("client,pace\n0,1\n", "needs a header with the columns client,speed"),
    ("client,speed\n0,1\n0,2\n", "line 3: client 0 is listed twice"),
    ("client,speed\n0,1\n", "no speed for client 1 (1 clients missing)"),
    ("client,speed\n0,1\n1,0\n", "line 3: speed must be a positive number"),
    ("client,speed\n0,1\n5,1\n", "line 3: client 5 does not exist"),
    ("client,speed\n0,fast\n1,1\n", "line 2: client must be an integer and speed a number"),
])
def test_a_bad_speeds_file_is_refused_in_one_line(tmp_path, text, message):
    p = tmp_path / "s.csv"
    p.write_text(text)
    with pytest.raises(DataFileError, match="clock.speeds_file") as err:
        read_speeds(str(p), 2)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_missing_speeds_file_is_refused(tmp_path):
    with pytest.raises(MissingDataError, match="no such file"):
        read_speeds(str(tmp_path / "none.csv"), 2)


@pytest.mark.parametrize("clock, message", [
    ({"round_deadline_s": 1.0}, "clock.round_deadline_s: needs speeds"),
    ({"speeds": "file"}, "clock.speeds_file: needed with speeds: file"),
    ({"speeds": "equal", "speeds_file": "x.csv"}, "clock.speeds_file: read only with speeds: file"),
])
def test_inconsistent_clock_keys_are_refused(clock, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_config(small_config(clock=clock))


def test_a_stream_has_its_own_clock(tmp_path):
    from support.configs import stream_config

    with pytest.raises(ConfigError, match="clock: is for synchronous rounds"):
        parse_config({**stream_config(tmp_path), "clock": {"speeds": "equal"}})


# --------------------------------------------------------------------------- whole runs
def _speeds(tmp_path, slow: int) -> str:
    p = tmp_path / "speeds.csv"
    p.write_text("client,speed\n" + "".join(f"{k},{0.1 if k == slow else 1.0}\n" for k in range(10)))
    return str(p)


def test_a_slow_client_misses_every_round_and_keeps_its_state(tmp_path):
    # Local: client 3 at a tenth of the speed never meets the deadline, so it never trains and
    # its local model scores the same in every evaluation; the others improve
    cfg = small_config(algorithm={"name": "local", "clients_per_round": 10, "rounds": 4, "eval_every": 2},
                       clock={"speeds": "file", "speeds_file": _speeds(tmp_path, 3), "round_deadline_s": 2.0})
    r = raysoft.run(cfg, out=tmp_path / "out")
    ev = pd.read_parquet(r.run_dir / "events.parquet")
    late = ev[ev.kind == "late_update"]
    assert late[["step", "client"]].values.tolist() == [[t, 3] for t in range(4)]
    m = r.metrics
    local = m[(m.scope == "client") & (m.metric == "mse")]
    three = local[local.entity == 3].sort_values("step").value.tolist()
    assert len(three) == 3 and three[0] == three[1] == three[2]
    others = local[local.entity != 3].groupby("step").value.mean()
    assert others.iloc[-1] < others.iloc[0]  # mse
    # every round waited for its deadline: the evaluation of round 2 is at 2 x 2.0 simulated s
    assert sorted(local.virtual_time.unique().tolist()) == [0.0, 4.0, 8.0]


def test_without_a_clock_there_is_no_simulated_time(tmp_path):
    r = raysoft.run(small_config(), out=tmp_path)
    assert r.metrics.virtual_time.isna().all()


def test_a_slow_client_fault_is_simulated_time_with_a_clock(tmp_path):
    # factor 1000 in simulated time: late from its round on, and no wall-clock sleep (the run
    # would take hours otherwise)
    cfg = small_config(algorithm={"name": "fedavg", "clients_per_round": 10},
                       clock={"speeds": "equal", "round_deadline_s": 5.0},
                       faults=[{"kind": "slow_client", "at_round": 2, "client": 7, "factor": 1000.0}])
    r = raysoft.run(cfg, out=tmp_path)
    ev = pd.read_parquet(r.run_dir / "events.parquet")
    assert ev[ev.kind == "late_update"][["step", "client"]].values.tolist() == [[2, 7], [3, 7]]


JITTERY = {"speeds": "lognormal", "sigma": 0.6, "jitter": 0.4, "round_deadline_s": 1.1}


def test_a_checkpointed_run_recovers_to_the_same_simulated_times(tmp_path):
    algo = {"rounds": 8, "eval_every": 2, "clients_per_round": 10}
    clean = raysoft.run(small_config(algorithm=algo, clock=JITTERY), out=tmp_path / "a")
    hit = raysoft.run(small_config(algorithm=algo, clock=JITTERY, output={"checkpoint_every": 3},
                                   faults=[{"kind": "kill_actor", "at_round": 5}]), out=tmp_path / "b")
    ev = pd.read_parquet(hit.run_dir / "events.parquet")
    assert "restored" in set(ev.kind) and (ev.kind == "late_update").sum() > 0
    assert clean.metrics.virtual_time.max() > 0
    pd.testing.assert_frame_equal(_values(hit), _values(clean), check_exact=True)


@pytest.mark.slow
@pytest.mark.ray
def test_the_same_clients_miss_the_same_rounds_on_every_packing(ray_session, tmp_path):
    algo = {"name": "fedsoft", "clients_per_round": 10, "rounds": 4}
    here = raysoft.run(small_config(algorithm=algo, clock=JITTERY), out=tmp_path / "a")
    there = raysoft.run(small_config(algorithm=algo, clock=JITTERY,
                                     ray={"backend": "ray", "clients_per_actor": 3, "num_cpus_per_actor": 0.5}),
                        out=tmp_path / "b")
    late = [pd.read_parquet(r.run_dir / "events.parquet").query("kind == 'late_update'")[["step", "client"]]
            .values.tolist() for r in (here, there)]
    assert late[0] == late[1] and len(late[0]) > 0
    pd.testing.assert_frame_equal(_values(there), _values(here), check_exact=True)
