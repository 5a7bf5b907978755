"""Client states out of RAM (ray.client_state: disk) or off the device (host): the same numbers as resident states, a
host holding no state between calls, and checkpoints, resumes and restarts that still match."""

import gc

import pandas as pd
import pytest
import torch
from support.configs import small_config, stream_config
from support.digests import SYNC, digest, expected_or_clean
from support.images import write_fmnist

import raysoft
from raysoft.backends.host import ClientHost
from raysoft.backends.states import StateStore
from raysoft.config import parse_config


@pytest.fixture(scope="module")
def fm_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fm-states")
    write_fmnist(root)
    return root


def _on_disk(cfg: dict, tmp_path, mode: str = "disk") -> dict:
    return {**cfg, "ray": {**cfg.get("ray", {}), "client_state": mode, "state_dir": str(tmp_path / "scratch")}}


@pytest.mark.parametrize("mode", ["disk", "host"])  # host: in CPU memory, on the device while used
@pytest.mark.parametrize("case", ["fedsoft", "fedem", "local", "ifca", "fpfc"])
def test_states_on_disk_give_the_pinned_numbers(case, mode, tmp_path):
    run = raysoft.run(_on_disk(small_config(**SYNC[case]), tmp_path, mode), out=tmp_path)
    clean = lambda: raysoft.run(small_config(**SYNC[case]), out=tmp_path / "clean")  # noqa: E731
    assert digest(run) == expected_or_clean(case, clean)


def test_a_stream_with_states_on_disk_gives_the_pinned_numbers(fm_root, tmp_path):
    run = raysoft.run(_on_disk(stream_config(fm_root), tmp_path), out=tmp_path)
    assert digest(run) == expected_or_clean("ccfl", lambda: raysoft.run(stream_config(fm_root), out=tmp_path / "clean"))


def test_a_host_keeps_no_state_in_memory_between_calls(tmp_path):
    cfg = parse_config(_on_disk(small_config(), tmp_path))
    host = ClientHost(cfg, range(10))
    store = host.states
    assert isinstance(store, StateStore) and store.disk_bytes() == 0  # nothing built yet
    d = sum(p.numel() for p in host.scratch.parameters())
    payload = {"u": torch.full((10, 2), 0.5).numpy(), "centers": torch.zeros(2, d)}  # lambda, sigma: the config's
    host.call("train", [2, 5], payload, 0)
    files = sorted(p.name for p in (tmp_path / "scratch").rglob("*.pt"))
    assert files == ["2.pt", "5.pt"] and not store._mem  # only the trained clients, on disk
    assert store.disk_bytes() > 0
    # estimating reads no state and evaluating changes none: neither writes a file
    host.call("estimate", list(range(10)), {"centers": torch.zeros(2, d)}, 0)
    host.call("evaluate", list(range(10)), {}, 0)
    assert sorted(p.name for p in (tmp_path / "scratch").rglob("*.pt")) == ["2.pt", "5.pt"]
    before = host.call("train", [5], payload, 1)[5].summed
    again = ClientHost(parse_config(small_config()), range(10))  # resident states, the same calls
    again.call("train", [2, 5], payload, 0)
    torch.testing.assert_close(again.call("train", [5], payload, 1)[5].summed, before, rtol=0, atol=0)
    folder = store._dir
    del host, store
    gc.collect()  # the host and its store refer to each other
    assert not folder.exists()  # the scratch folder goes with its host


def test_resume_and_restart_with_states_on_disk(tmp_path):
    base = dict(algorithm={"rounds": 8, "eval_every": 2}, data={"clients": 10})
    clean = raysoft.run(small_config(**base), out=tmp_path / "clean")
    cfg = _on_disk(small_config(**base, output={"checkpoint_every": 3},
                                faults=[{"kind": "kill_actor", "at_round": 5}]), tmp_path)
    r = raysoft.run(cfg, out=tmp_path / "disk")  # killed at round 5, back from the round-3 checkpoint
    for table in ("metrics", "weights"):
        a, b = (pd.read_parquet(d / f"{table}.parquet").drop(columns=["run_id", "time_s"], errors="ignore")
                for d in (clean.run_dir, r.run_dir))
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    (r.run_dir / "summary.json").unlink()  # as if stopped after its last checkpoint
    resumed = raysoft.resume(r.run_dir)
    assert digest(resumed) == digest(clean)


@pytest.mark.slow
def test_a_killed_hosts_state_folder_is_removed_by_the_next_store(tmp_path):
    """A host killed with SIGKILL cannot remove its folder: the next store on the node does,
    keeping folders of live processes and of other nodes."""
    import os
    import signal
    import subprocess
    import sys

    from raysoft.backends.states import PREFIX, _prefix

    code = ("import sys, time; from raysoft.backends.states import StateStore; "
            "s = StateStore('disk', lambda k: {'w': 0}, [0], sys.argv[1]); s[0] = {'w': 1}; "
            "print(s._dir, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    orphan = tmp_path / proc.stdout.readline().strip().split("/")[-1]
    assert (orphan / "0.pt").exists()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert orphan.exists()  # SIGKILL: no clean-up ran
    live = tmp_path / f"{_prefix()}{os.getpid()}-live"
    other_node = tmp_path / f"{PREFIX}another-node-{proc.pid}-x"
    for d in (live, other_node):
        d.mkdir()
    store = StateStore("disk", lambda k: {"w": 0}, [0], str(tmp_path))
    assert not orphan.exists() and live.exists() and other_node.exists() and store._dir.exists()
