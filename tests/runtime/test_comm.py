"""comm.parquet: the bytes every client received and sent, counted by hand for FedAvg, IFCA,
FedSoft, a stream (CCFL) and a plug-in, and the summary's totals equal to the table's sums."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
import torch
from support.configs import small_config, stream_config
from support.fakes import FakeExecutor, OneCall
from support.images import write_fmnist

import raysoft
from raysoft.algorithms import WeightedMean
from raysoft.config import parse_config
from raysoft.data import Federation
from raysoft.errors import ClientFailure, PluginFailure
from raysoft.models import build_model
from raysoft.plugins import clear_cache
from raysoft.results import Recorder
from raysoft.runtime.comm import Ledger, download_bytes, wire_bytes
from raysoft.runtime.rounds import RoundCoordinator

F32, F64, NUMBER = 4, 8, 8  # bytes of a float32, a float64 and a Python int or float


def model_size(cfg: dict) -> int:
    """d, the model's parameter count (counted from the model itself, not from raysoft's walker)."""
    c = parse_config(cfg)
    return sum(p.numel() for p in build_model(c.model, Federation(c.data, c.seed).info).parameters())


def comm(run) -> pd.DataFrame:
    return pd.read_parquet(run.run_dir / "comm.parquet")


def by_client(df: pd.DataFrame) -> dict[tuple[int, int], tuple[int, int]]:
    """{(step, client): (down, up)}"""
    wide = df.pivot_table(index=["step", "client"], columns="direction", values="bytes", aggfunc="sum")
    return {(int(s), int(k)): (int(r["down"]), int(r["up"])) for (s, k), r in wide.iterrows()}


def check_totals(run, df: pd.DataFrame, clients: int) -> None:
    """The summary's cumulative bytes are the table's sums (and their per-client means)."""
    s = run.summary
    for direction in ("down", "up"):
        total = int(df.loc[df["direction"] == direction, "bytes"].sum())
        assert s[f"bytes_{direction}"] == total
        assert s[f"bytes_{direction}_per_client"] == pytest.approx(total / clients)


# ---------------------------------------------------------------- the walker
def test_wire_bytes_by_hand():
    assert wire_bytes(torch.zeros(3, 5)) == 60  # float32
    assert wire_bytes(torch.zeros(7, dtype=torch.float64)) == 56
    assert wire_bytes(np.zeros(4, dtype=np.int8)) == 4
    assert wire_bytes((2, 0.5, True, None, "model", np.float32(1.0))) == 8 + 8 + 1 + 0 + 5 + 4
    assert wire_bytes({"a": [torch.zeros(2), {"b": np.zeros(3)}]}) == 8 + 24

    @dataclass
    class Reply:
        model: torch.Tensor
        t: int

    assert wire_bytes(Reply(torch.zeros(2, dtype=torch.float16), 3)) == 4 + 8


def test_download_bytes_counts_the_shared_entries_once_per_client_and_each_client_s_own_entry():
    payload = {"centers": torch.zeros(3, 10), "u": np.zeros((5, 3)), "w": {1: np.zeros(2, np.float32)}, "x": 0.1}
    out = download_bytes(payload, [1, 4], each=("u",))
    assert out == {1: 120 + 8 + 8 + 24, 4: 120 + 8 + 8 + 24}  # centers, x, the whole w, a row of u (not [5, 3])
    assert download_bytes(payload, [1], each=("u", "w")) == {1: 120 + 8 + 24 + 8}
    assert download_bytes(payload, [1], each="u") == download_bytes(payload, [1], each=("u",))  # one key
    with pytest.raises(PluginFailure, match="no entry for client 4"):
        download_bytes(payload, [1, 4], each=("w",))
    with pytest.raises(PluginFailure, match="'v', which is not a key"):
        download_bytes(payload, [1], each=("v",))
    with pytest.raises(PluginFailure, match=r"no entry for client 5 \(its shape is \(5, 3\)\)"):
        download_bytes(payload, [1, 5], each=("u",))


def test_a_ledger_adds_a_round_s_calls_and_writes_down_then_up():
    ledger = Ledger()
    ledger.sent({3: 10, 1: 10})
    ledger.sent({3: 5})
    ledger.returned(3, 7)  # client 1 never answered: up 0
    recorder = Recorder("r")
    ledger.write(recorder, 4)
    table = recorder.tables()["comm"].to_pylist()
    assert [(r["client"], r["direction"], r["bytes"]) for r in table] == [
        (1, "down", 10), (1, "up", 0), (3, "down", 15), (3, "up", 7)]
    assert {(r["run_id"], r["step"]) for r in table} == {("r", 4)}


# ---------------------------------------------------------------- the engine, over a fake executor
def fake_rows(coord) -> list[tuple]:
    c = coord.recorder.columns["comm"]
    return list(zip(c["step"], c["client"], c["direction"], c["bytes"]))


def fake_coordinator(executor, run_dir=None, reduce=None, **sections):
    cfg = parse_config(small_config(**sections))
    return RoundCoordinator(cfg, executor, OneCall(reduce=reduce), "run", None if run_dir is None else str(run_dir))


@pytest.mark.parametrize("in_actors", [True, False])
def test_a_late_client_received_the_payload_and_a_non_finite_update_was_still_sent(in_actors):
    def train(k, payload, t):  # client 2's update is NaN; one float32 each
        return torch.tensor([float("nan") if k == 2 else float(k)])

    coord = fake_coordinator(FakeExecutor({"train": train}, late=[1]), reduce=WeightedMean(np.ones(10)),
                             ray={"reduce_in_actors": in_actors}, algorithm={"rounds": 1},
                             train={"nan_policy": "exclude"})
    while not coord.advance()["done"]:
        pass
    # payload {"x": t}: an int, 8 bytes, to clients 0, 1, 2; client 1 late (nothing back)
    assert fake_rows(coord) == [(1, 0, "down", 8), (1, 0, "up", 4), (1, 1, "down", 8), (1, 1, "up", 0),
                                (1, 2, "down", 8), (1, 2, "up", 4)]


def test_a_recovered_round_is_counted_once(tmp_path):
    failed: list[int] = []

    def train(k, payload, t):  # the executor dies at its first call of round 2
        if t == 2 and not failed:
            failed.append(k)
            raise ClientFailure("actor died")
        return torch.tensor([float(k + t)])

    coord = fake_coordinator(FakeExecutor({"train": train}), run_dir=tmp_path, output={"checkpoint_every": 2})
    while not coord.advance()["done"]:
        pass
    assert failed and fake_rows(coord) == [(step, k, d, 8 if d == "down" else 4)
                                           for step in range(1, 5) for k in (0, 1, 2) for d in ("down", "up")]
    assert coord.summary()["bytes_down"] == 4 * 3 * 8


# ---------------------------------------------------------------- rounds, by hand
@pytest.mark.parametrize("in_actors", [True, False])
def test_fedavg_sends_one_model_down_and_one_up_to_each_selected_client(tmp_path, in_actors):
    cfg = small_config(algorithm={"name": "fedavg"}, ray={"reduce_in_actors": in_actors})
    d = model_size(cfg)
    run = raysoft.run(cfg, out=tmp_path)
    df = comm(run)
    cells = by_client(df)
    assert sorted({s for s, _ in cells}) == [1, 2, 3, 4]  # one step per round, filed as its evaluation is
    for step in range(1, 5):
        assert sum(1 for s, _ in cells if s == step) == 6  # clients_per_round
    assert set(cells.values()) == {(F32 * d, F32 * d)}
    check_totals(run, df, 10)
    assert run.summary["bytes_down"] == 4 * 6 * F32 * d


def test_the_table_is_the_same_whether_the_sums_are_made_in_the_actors_or_not(tmp_path):
    a, b = (raysoft.run(small_config(ray={"reduce_in_actors": flag}), out=tmp_path / str(flag))
            for flag in (True, False))
    pd.testing.assert_frame_equal(comm(a).drop(columns="run_id"), comm(b).drop(columns="run_id"))  # FedSoft


@pytest.mark.parametrize("option", ["model", "gradient"])
def test_ifca_sends_every_center_down_and_a_model_or_gradient_and_a_cluster_id_up(tmp_path, option):
    s = 3
    cfg = small_config(algorithm={"name": "ifca", "num_centers": s, "option": option, "init_threshold": 0.0})
    d = model_size(cfg)
    run = raysoft.run(cfg, out=tmp_path)
    df = comm(run)
    cells = by_client(df)
    # the S centers alone: the option and the assignment rule are settings, which every client
    # knows from the run's config (not sent; before, len(option) + len("loss") more bytes)
    down = s * F32 * d
    up = NUMBER + F32 * d  # (the chosen center, its model or its gradient)
    assert set(cells.values()) == {(down, up)}
    assert len(cells) == 4 * 6
    check_totals(run, df, 10)


def test_ifca_s_initialiser_sends_the_centers_to_every_client_and_gets_a_cluster_id_back(tmp_path):
    s = 2
    cfg = small_config(algorithm={"name": "ifca", "num_centers": s, "init_threshold": 1.0, "init_attempts": 3})
    d = model_size(cfg)
    cells = by_client(comm(raysoft.run(cfg, out=tmp_path)))
    # round 0: 3 draws, every one refused (no center holds all the clients): 3 x (S centers down, an id up)
    train_down, train_up = s * F32 * d, NUMBER + F32 * d  # the centers (the settings are known, not sent)
    first = {k: v for (step, k), v in cells.items() if step == 1}
    assert len(first) == 10
    for down, up in first.values():
        assert (down, up) in {(3 * s * F32 * d, 3 * NUMBER), (3 * s * F32 * d + train_down, 3 * NUMBER + train_up)}
    assert sum(up > 3 * NUMBER for _, up in first.values()) == 6


def test_fedsoft_sends_s_centers_and_its_own_weights_and_gets_estimates_and_its_model_back(tmp_path):
    s = 2
    cfg = small_config(algorithm={"name": "fedsoft", "num_centers": s, "estimation_interval": 2})
    d = model_size(cfg)
    run = raysoft.run(cfg, out=tmp_path)
    df = comm(run)
    cells = by_client(df)
    # the payloads carry the run's state only: sigma, lambda (prox_weight) and start are settings,
    # which every client knows from the run's config. (Before, the estimate also sent sigma, a
    # float, 8 bytes, and the train call lambda, 8 bytes, and start, len("local") = 5 bytes.)
    estimate = (s * F32 * d, s * F64)  # (S centers, u_k: S float64 importance weights)
    train = (s * F32 * d + s * F64, F32 * d + NUMBER)  # (S centers + u_k, w_k + its distance to its mixture)
    both = (estimate[0] + train[0], estimate[1] + train[1])
    for (step, k), cell in cells.items():
        estimated = (step - 1) % 2 == 0  # rounds 0 and 2 (steps 1 and 3) estimate first
        assert cell in ({estimate, both} if estimated else {train}), (step, k, cell)
    for step in (1, 3):  # everyone estimates
        assert sum(1 for st, _ in cells if st == step) == 10
    trainers = {step: sum(1 for (st, _), c in cells.items() if st == step and c != estimate) for step in range(1, 5)}
    assert all(1 <= n <= 10 for n in trainers.values())
    check_totals(run, df, 10)


def test_local_takes_part_and_sends_nothing(tmp_path):
    run = raysoft.run(small_config(algorithm={"name": "local"}), out=tmp_path)
    df = comm(run)
    assert len(df) == 4 * 6 * 2 and (df["bytes"] == 0).all()
    assert run.summary["bytes_down"] == 0 == run.summary["bytes_up"]


# ---------------------------------------------------------------- a plug-in, counted by the same rule
PLUGIN = '''
import numpy as np
from raysoft.sdk import (AlgorithmConfig, ClientCall, Configured, RoundResult, Update, WeightedMean,
                         evaluate_vector, get_flat, numpy_rng, scratch_optimizer, train_from, uniform_selection)


class Config(AlgorithmConfig):
    pass


def _train(ctx, opt, payload, t):
    tag = payload["tags"][ctx.client]  # its own entry
    return opt, Update(train_from(ctx, opt, payload["model"], t), {"tag": np.full(3, len(tag), dtype=np.int16)})


def _evaluate(ctx, opt, payload, t):
    return opt, evaluate_vector(ctx, payload["model"])


class Tagged(Configured[Config]):
    Settings = Config
    client_ops = {"train": _train, "evaluate": _evaluate}

    def init_server(self, ctx):
        return get_flat(ctx.new_model("center", 0))

    def init_client(self, ctx):
        return scratch_optimizer(ctx)

    def round(self, ctx, state, t):
        chosen = uniform_selection(ctx.num_clients, self.settings.clients_per_round,
                                   numpy_rng(ctx.cfg.seed, "select", t))
        tags = {k: np.arange(k + 1, dtype=np.float64) for k in chosen}  # client k gets k + 1 float64s
        res = yield ClientCall("train", chosen, {"model": state, "tags": tags}, reduce=WeightedMean(ctx.sizes),
                               each=("tags",))
        return RoundResult(res.value, trained=len(res.clients))

    def eval_payload(self, state):
        return {"model": state}
'''


def test_a_plug_in_s_payloads_and_results_are_counted_by_the_same_rule(tmp_path, monkeypatch):
    folder = tmp_path / "plug"
    folder.mkdir()
    (folder / "tagged_comm.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.chdir(folder)
    clear_cache()
    try:
        cfg = small_config(algorithm={"name": "tagged_comm:Tagged"})
        d = model_size(small_config())
        run = raysoft.run(cfg, out=tmp_path / "out")
    finally:
        sys.modules.pop("tagged_comm", None)
        clear_cache()
    df = comm(run)
    for (_, k), (down, up) in by_client(df).items():
        assert down == F32 * d + F64 * (k + 1)  # the model, and its own tags only
        assert up == F32 * d + 3 * 2  # the model and three int16 (an Update's extras count as sent)
    check_totals(run, df, 10)


# ---------------------------------------------------------------- a stream: a row per upload
@pytest.mark.slow
def test_a_stream_has_a_row_per_upload_with_its_download_and_upload(tmp_path):
    cfg = stream_config(tmp_path, drift=False)
    write_fmnist(tmp_path)
    d = model_size(cfg)
    run = raysoft.run(cfg, out=tmp_path / "out")
    df = comm(run)
    assert sorted(df.loc[df["direction"] == "up", "step"]) == list(range(1, 25))  # one upload each epoch
    cells = by_client(df)
    assert set(cells.values()) == {(F32 * d, F32 * d)}  # CCFL: a model down (cold start or reply), a model up
    check_totals(run, df, 6)
    metrics = pd.read_parquet(run.run_dir / "metrics.parquet")
    for direction in ("down", "up"):  # the same bytes as each upload's costs in metrics.parquet
        costs = metrics.loc[metrics["metric"] == f"bytes_{direction}", "value"]
        assert costs.sum() == run.summary[f"bytes_{direction}"]


@pytest.mark.slow
@pytest.mark.ray
def test_the_same_bytes_on_the_ray_backend_whatever_the_packing(ray_session, tmp_path):
    """Sizes are counted where the results are made (the actors', clients visiting other actors
    with ray.balance: cost) and come out as in one process."""
    ref = comm(raysoft.run(small_config(), out=tmp_path / "ref")).drop(columns="run_id")
    for packing in (1, 4):
        cfg = small_config(ray={"backend": "ray", "clients_per_actor": packing, "num_cpus_per_actor": 0.1})
        got = comm(raysoft.run(cfg, out=tmp_path / str(packing))).drop(columns="run_id")
        pd.testing.assert_frame_equal(got, ref)
