"""examples/fedbuff: FedBuff (Nguyen et al. 2022) as a stream plug-in, on a drifting dataset
plug-in (examples/fedbuff/blobs.py). Its server maths by hand, a run in-process with every
server step checked against Algorithm 1, the same numbers after a resume and on Ray for two
packings of clients, and the command line from the example's own folder."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from support.paths import EXAMPLES
from support.runs import values as _values

import raysoft

EXAMPLE = EXAMPLES / "fedbuff"
RAYSOFT = str(Path(sys.executable).parent / "raysoft")
NAME = "fedbuff:FedBuff"

sys.path.insert(0, str(EXAMPLE))  # the same module objects the run resolves `fedbuff:FedBuff` and `blobs:...` to
import blobs  # noqa: E402
import fedbuff  # noqa: E402
from fedbuff import FedBuff, FedBuffConfig, FedBuffState, apply_buffer, on_upload, staleness_weight  # noqa: E402


def settings(**kw) -> FedBuffConfig:
    return FedBuffConfig(name=NAME, **kw)


def tiny(**algo) -> dict:
    """The example's job, small: 6 clients, 3 distributions, 30 uploads, a buffer of 4."""
    cfg = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    cfg["algorithm"].update(rounds=30, eval_every=10, buffer_size=4, public_samples=20, **algo)
    cfg["data"].update(clients=6, samples_min=20, samples_max=40, test_samples=60)
    cfg["ray"] = {"backend": "inprocess"}
    cfg["output"] = {"progress": "none"}
    return cfg


# ----------------------------------------------------------------------------- the maths by hand
def test_staleness_weight_and_the_buffers_step_by_hand():
    assert staleness_weight(0) == 1.0 and staleness_weight(3) == pytest.approx(0.5)  # 1 / sqrt(1 + 3)
    assert staleness_weight(8, "constant") == 1.0
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        staleness_weight(-1)
    w = torch.tensor([1.0, 2.0])
    assert torch.equal(apply_buffer(w, torch.tensor([4.0, -2.0]), 2, 0.5), torch.tensor([0.0, 2.5]))  # w - 0.5 * b / 2


def test_two_uploads_fill_a_buffer_of_two_by_hand():
    s = settings(buffer_size=2, server_lr=1.0, clients=2)
    w0 = torch.tensor([1.0, 1.0])
    state = FedBuff(s).init_stream_server(torch.stack([w0, w0 + 5]))  # w: the first initialisation
    assert torch.equal(state.w, w0) and state.version == 0 and state.clusters == 2
    # client 0 trained from version 0 to [0, 1]: Delta = [1, 0], staleness 0, weight 1; buffered only
    one, d1 = on_upload(state, 0, torch.tensor([0.0, 1.0]), 0, s)
    assert one.version == 0 and one.count == 1 and torch.equal(one.w, w0) and d1["applied"] == 0.0
    assert torch.equal(one.buffer, torch.tensor([1.0, 0.0])) and state.count == 0  # the old state untouched
    # client 1 trained from version 0 to [1, -1]: Delta = [0, 2]; the buffer's mean [0.5, 1] applied
    two, d2 = on_upload(one, 1, torch.tensor([1.0, -1.0]), 0, s)
    assert two.version == 1 and two.count == 0 and two.buffer is None and d2["applied"] == 1.0
    assert torch.equal(two.w, torch.tensor([0.5, 0.0]))
    assert sorted(two.models) == [0, 1] and two.holders == {0: 0, 1: 1}  # client 0 still trains from version 0
    # client 0 uploads [0.5, 1] trained from version 0, one version ago: Delta = [0.5, 0] / sqrt(2)
    three, d3 = on_upload(two, 0, torch.tensor([0.5, 1.0]), 0, s)
    assert d3["staleness"] == 1.0 and d3["weight"] == pytest.approx(1 / math.sqrt(2))
    torch.testing.assert_close(three.buffer, torch.tensor([0.5 / math.sqrt(2), 0.0]))
    assert sorted(three.models) == [1] and three.holders == {0: 1, 1: 1}  # nobody trains from version 0 now


def test_a_stale_update_weighs_less():
    s = settings(buffer_size=10, clients=1)
    state = FedBuffState(w=torch.zeros(2), version=3, models={0: torch.ones(2), 3: torch.zeros(2)}, clusters=1)
    new, d = on_upload(state, 0, torch.zeros(2), 0, s)  # trained from version 0, three versions ago
    assert d["staleness"] == 3.0 and d["weight"] == pytest.approx(0.5)
    torch.testing.assert_close(new.buffer, torch.tensor([0.5, 0.5]))
    assert sorted(new.models) == [3]  # every client has uploaded and holds 3: version 0 is forgotten


@pytest.mark.parametrize("bad", [{"buffer_size": 0}, {"server_lr": 0.0}, {"staleness": "poly"}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        settings(**bad)


def test_the_blobs_drift_between_cycles_and_are_reproducible():
    cfg = blobs.BlobSettings(name="blobs:DriftingBlobs", clients=4, distributions=3, partition="random")
    a, b = blobs.DriftingBlobs(cfg, 7), blobs.DriftingBlobs(cfg, 7)
    first = np.array([0.7, 0.2, 0.1])
    x0, y0, c0 = a.client(1, 50, first)
    assert x0.shape == (50, 8) and y0.dtype == torch.int64 and 0 <= int(y0.min()) and int(y0.max()) < 4
    x1, _, c1 = a.client_cycle(1, 1, 50, first)
    x1b, _, c1b = b.client_cycle(1, 1, 50, first)
    assert torch.equal(x1, x1b) and (c1 == c1b).all() and not torch.equal(x0, x1)
    shares = [np.bincount(a.client_cycle(1, c, 400, first)[2], minlength=3)[0] / 400 for c in range(1, 6)]
    assert all(0.3 < s < 0.95 for s in shares) and len(set(shares)) == 5  # the main share moves, stays the main


# ----------------------------------------------------------------------------- runs
def _spy(monkeypatch) -> list[dict]:
    seen: list[dict] = []
    original = fedbuff.FedBuff.server_step

    def server_step(self, state, client, up, scratch, val_sets):
        new, model, diag = original(self, state, client, up, scratch, val_sets)
        seen.append({**diag["diagnostics"], "client": client, "trained_from": up["extras"]["version"],
                     "before": state, "after": new, "w": up["w"]})
        return new, model, diag

    monkeypatch.setattr(fedbuff.FedBuff, "server_step", server_step)
    return seen


def test_a_run_on_the_dataset_plugin_applies_the_buffer_every_k_uploads(tmp_path, monkeypatch):
    monkeypatch.chdir(EXAMPLE)
    steps = _spy(monkeypatch)
    r = raysoft.run(tiny(), out=tmp_path)
    summary = json.loads((r.run_dir / "summary.json").read_text())
    assert summary["kind"] == "stream" and summary["algorithm"] == NAME and summary["uploads"] == 30
    assert summary["dataset"] == "blobs:DriftingBlobs" and 0.0 <= summary["cli_bfr"] <= 1.0
    assert [s["applied"] for s in steps] == [float(i % 4 == 3) for i in range(30)]  # every K = 4 uploads
    for s in steps:
        before, after = s["before"], s["after"]
        # the version the client trained from came back with its upload (the reply's extras)
        assert s["staleness"] == before.version - s["trained_from"] >= 0
        assert s["weight"] == pytest.approx(1 / math.sqrt(1 + s["staleness"]))
        delta = before.models[s["trained_from"]] - s["w"]
        buffered = s["weight"] * delta if before.buffer is None else before.buffer + s["weight"] * delta
        if s["applied"]:
            assert torch.allclose(after.w, before.w - buffered / 4) and after.version == before.version + 1
        else:
            assert torch.equal(after.buffer, buffered) and torch.equal(after.w, before.w)
    assert max(s["staleness"] for s in steps) >= 1  # stale updates happen
    # the clients' data drifts: their true mixtures change from upload to upload
    clients = pd.read_parquet(r.run_dir / "clients.parquet")
    assert clients.groupby(["client", "distribution"]).share.nunique().max() > 1
    diag = pd.read_parquet(r.run_dir / "diagnostics.parquet")
    assert sorted(diag.name.unique()) == ["applied", "staleness", "version", "weight"]


def test_a_resumed_run_ends_with_the_uninterrupted_runs_numbers(tmp_path, monkeypatch):
    monkeypatch.chdir(EXAMPLE)
    cfg = tiny()
    ref = raysoft.run(cfg, out=tmp_path / "clean")
    stopped = raysoft.run({**cfg, "output": {"progress": "none", "checkpoint_every": 11}}, out=tmp_path / "cp")
    (stopped.run_dir / "summary.json").unlink()  # as if stopped after its last checkpoint (upload 22)
    resumed = raysoft.resume(stopped.run_dir)
    for table in ("metrics", "clients", "diagnostics"):
        pd.testing.assert_frame_equal(_values(resumed, table), _values(ref, table), check_exact=True)


@pytest.mark.slow
@pytest.mark.ray
def test_on_ray_the_stream_is_identical_for_two_packings_and_in_process(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(EXAMPLE)
    ref = _values(raysoft.run(tiny(), out=tmp_path / "here"))
    for packing in (1, 3):
        cfg = tiny()
        cfg["ray"] = {"backend": "ray", "clients_per_actor": packing, "num_cpus_per_actor": 0.25}
        pd.testing.assert_frame_equal(_values(raysoft.run(cfg, out=tmp_path / f"ray{packing}")), ref,
                                      check_exact=True)


@pytest.mark.slow
def test_the_job_runs_from_the_examples_folder(tmp_path):
    sets = ["data.clients=6", "algorithm.rounds=12", "algorithm.eval_every=6", "ray.backend=inprocess",
            "output.progress=none"]
    done = subprocess.run([RAYSOFT, "run", "job.yaml", *[x for s in sets for x in ("--set", s)], "--out",
                           str(tmp_path)], cwd=EXAMPLE, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algorithm"] == NAME and summary["uploads"] == 12
