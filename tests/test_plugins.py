"""Plug-ins: names resolved by import path and by entry point, their settings validated and
listed, every kind of bad plug-in refused in one line before anything starts, a plug-in that
raises during a run named with its client, and the MLflow logger."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support.configs import small_config

import raysoft
from raysoft.errors import PluginFailure
from raysoft.plugins import PluginError, clear_cache, resolve

RAYSOFT = str(Path(sys.executable).parent / "raysoft")

# FedAvg with a server step size: model <- model + server_lr * (average - model). server_lr = 1
# is FedAvg itself. Its server state is a dataclass of its own (checkpointed like the built-ins').
SERVER_LR = '''
from dataclasses import dataclass

import torch
from pydantic import Field

from raysoft.sdk import (AlgorithmConfig, ClientCall, Configured, RoundResult, WeightedMean, evaluate_vector, get_flat,
                         numpy_rng, scratch_optimizer, train_from, uniform_selection)


class ServerLRConfig(AlgorithmConfig):
    server_lr: float = Field(1.0, gt=0.0, description="the server's step towards the clients' average")
    fail_client: int = Field(-1, description="a client whose training raises (tests)")


@dataclass
class ServerLRState:
    model: torch.Tensor


def _train(ctx, opt, payload, t):
    if ctx.client == payload["fail_client"]:
        raise ValueError("this client's data is bad")
    return opt, train_from(ctx, opt, payload["model"], t)


def _evaluate(ctx, opt, payload, t):
    return opt, evaluate_vector(ctx, payload["model"])


class ServerLR(Configured[ServerLRConfig]):
    """FedAvg with a server step size."""

    Settings = ServerLRConfig
    client_ops = {"train": _train, "evaluate": _evaluate}

    def init_server(self, ctx):
        return ServerLRState(get_flat(ctx.new_model("center", 0)))

    def init_client(self, ctx):
        return scratch_optimizer(ctx)

    def round(self, ctx, state, t):
        s = self.settings
        chosen = uniform_selection(ctx.num_clients, s.clients_per_round, numpy_rng(ctx.cfg.seed, "select", t))
        res = yield ClientCall("train", chosen, {"model": state.model, "fail_client": s.fail_client},
                               reduce=WeightedMean(ctx.sizes))
        if not res.clients:
            return RoundResult(state, trained=0)
        if s.server_lr == 1.0:
            return RoundResult(ServerLRState(res.value), trained=len(res.clients))
        return RoundResult(ServerLRState(state.model + s.server_lr * (res.value - state.model)),
                           trained=len(res.clients))

    def centers(self, state):
        return state.model[None, :]

    def weights(self, state):
        return None

    def eval_payload(self, state):
        return {"model": state.model}
'''


@pytest.fixture
def plugdir(tmp_path, monkeypatch):
    """A folder with the plug-in modules, the current directory of the test; each test's
    modules get fresh names so that nothing cached by an earlier test is reused."""
    d = tmp_path / "plug"
    d.mkdir()
    monkeypatch.chdir(d)
    clear_cache()
    before = set(sys.modules)
    yield d
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], "__file__", "") and str(d) in str(sys.modules[name].__file__):
            del sys.modules[name]
    clear_cache()


def write(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(textwrap.dedent(text))


def values(run) -> pd.DataFrame:
    m = pd.read_parquet(run.run_dir / "metrics.parquet")
    return m[["step", "scope", "entity", "eval_dist", "metric", "value"]].reset_index(drop=True)


def test_an_import_path_algorithm_runs_and_equals_fedavg_at_server_lr_1(plugdir, tmp_path):
    write(plugdir, "serverlr_a.py", SERVER_LR)
    plug = raysoft.run(small_config(algorithm={"name": "serverlr_a:ServerLR", "server_lr": 1.0}), out=tmp_path / "a")
    base = raysoft.run(small_config(algorithm={"name": "fedavg"}), out=tmp_path / "b")
    pd.testing.assert_frame_equal(values(plug), values(base))
    assert plug.summary["algorithm"] == "serverlr_a:ServerLR" and plug.summary["kind"] == "rounds"
    half = raysoft.run(small_config(algorithm={"name": "serverlr_a:ServerLR", "server_lr": 0.5}), out=tmp_path / "c")
    assert not values(half)["value"].equals(values(base)["value"])  # the setting reaches the algorithm


def test_a_plugins_states_are_checkpointed_and_resumed(plugdir, tmp_path):
    write(plugdir, "serverlr_b.py", SERVER_LR)
    cfg = small_config(algorithm={"name": "serverlr_b:ServerLR", "server_lr": 0.5},
                       output={"checkpoint_every": 2, "progress": "none"})
    whole = raysoft.run(cfg, out=tmp_path / "whole")
    from raysoft.runtime.checkpoint import load_checkpoint

    blob = load_checkpoint(whole.run_dir)  # weights_only: the plug-in's state class is allowed
    assert type(blob["state"]).__name__ == "ServerLRState"
    # a run stopped after its round-2 checkpoint, resumed, equals the whole run
    part = tmp_path / "part"
    cut = small_config(algorithm={"name": "serverlr_b:ServerLR", "server_lr": 0.5, "rounds": 2},
                       output={"checkpoint_every": 2, "progress": "none"})
    first = raysoft.run(cut, out=part)
    cfg_file = first.run_dir / "config.yaml"
    resumed_cfg = yaml.safe_load(cfg_file.read_text())
    resumed_cfg["algorithm"]["rounds"] = 4
    cfg_file.write_text(yaml.safe_dump(resumed_cfg))
    (first.run_dir / "summary.json").unlink()
    resumed = raysoft.resume(first.run_dir)
    pd.testing.assert_frame_equal(values(resumed), values(whole))


def test_a_checkpoint_that_could_not_be_resumed_stops_the_run_at_once(plugdir, tmp_path, capsys):
    # the server state's class lives in a helper module: not allowed in a checkpoint unless listed
    from raysoft.cli import main as cli_main

    write(plugdir, "servermath_y.py", "from dataclasses import dataclass\n\nimport torch\n\n\n@dataclass\n"
                                      "class MomentumState:\n    model: torch.Tensor\n")
    helper = textwrap.dedent(SERVER_LR).replace(
        "@dataclass\nclass ServerLRState:\n    model: torch.Tensor\n",
        "from servermath_y import MomentumState as ServerLRState\n")
    assert "from servermath_y import" in helper
    write(plugdir, "serverlr_y.py", helper)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config(algorithm={"name": "serverlr_y:ServerLR", "rounds": 40},
                                               output={"checkpoint_every": 1})))
    assert cli_main(["run", str(cfg), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        "raysoft: error: output.checkpoint_every: algorithm 'serverlr_y:ServerLR''s checkpoint holds "
        "servermath_y.MomentumState, which --resume would refuse, so the run stopped at its first checkpoint; list "
        "the class in the algorithm's state_types (state_types = (MomentumState,)) or define it in the plug-in's "
        "own module\n")
    assert list((tmp_path / "out").iterdir()) == []  # nothing written
    # the fix the line gives: the run checkpoints, and its checkpoint resumes
    listed = "    Settings = ServerLRConfig\n    state_types = (ServerLRState,)\n"
    write(plugdir, "serverlr_z.py", helper.replace("    Settings = ServerLRConfig\n", listed))
    from raysoft.runtime.checkpoint import load_checkpoint

    fixed = raysoft.run(small_config(algorithm={"name": "serverlr_z:ServerLR"}, output={"checkpoint_every": 1}),
                        out=tmp_path / "fixed")
    assert type(load_checkpoint(fixed.run_dir)["state"]).__name__ == "MomentumState"


@pytest.mark.slow
def test_settings_of_a_plugin_are_validated_and_set_from_the_command_line(plugdir, tmp_path):
    write(plugdir, "serverlr_c.py", SERVER_LR)
    (plugdir / "job.yaml").write_text(yaml.safe_dump(small_config(algorithm={"name": "serverlr_c:ServerLR"})))
    out = tmp_path / "out"
    bad = subprocess.run([RAYSOFT, "run", "job.yaml", "--set", "algorithm.server_lr=-1", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "algorithm.server_lr" in bad.stderr, bad.stderr
    assert not out.exists() or not any(out.iterdir())
    good = subprocess.run([RAYSOFT, "run", "job.yaml", "--set", "algorithm.server_lr=0.25", "--set",
                           "algorithm.rounds=2", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert good.returncode == 0, good.stderr
    run_dir = Path(good.stdout.strip().splitlines()[-1])
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["algorithm"]["server_lr"] == 0.25


@pytest.mark.slow
def test_raysoft_list_shows_a_plugins_settings(plugdir):
    write(plugdir, "serverlr_p.py", SERVER_LR)
    out = subprocess.run([RAYSOFT, "list", "algorithms", "serverlr_p:ServerLR"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "serverlr_p:ServerLR  [import path]" in out.stdout
    assert "FedAvg with a server step size." in out.stdout
    assert "server_lr: float = 1.0 (> 0.0)  # the server's step towards the clients' average" in out.stdout
    assert "rounds: int = 100" in out.stdout


def fake_distribution(site: Path, dist: str, entries: dict[str, dict[str, str]]) -> None:
    """An installed distribution as importlib.metadata finds it: a dist-info folder with METADATA
    and entry_points.txt (what ``pip install`` of a package with entry points writes)."""
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    text = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in names.items()) + "\n"
                   for group, names in entries.items())
    (info / "entry_points.txt").write_text(text)


@pytest.mark.slow
def test_a_registered_plugin_is_listed_and_runs_by_its_name(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    write(site, "serverlr_pkg.py", SERVER_LR)
    fake_distribution(site, "serverlr_pkg", {"raysoft.algorithms": {"server_lr": "serverlr_pkg:ServerLR"}})
    env = {**os.environ, "PYTHONPATH": str(site)}
    listed = subprocess.run([RAYSOFT, "list", "algorithms"], capture_output=True, text=True, env=env, timeout=300,
                            cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "server_lr  [from serverlr_pkg]" in listed.stdout and "fedsoft  [built in]" in listed.stdout
    assert "server_lr: float = 1.0" in listed.stdout
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(small_config(algorithm={"name": "server_lr", "server_lr": 0.5, "rounds": 2})))
    ran = subprocess.run([RAYSOFT, "run", str(job), "--out", str(tmp_path / "runs")], capture_output=True,
                         text=True, env=env, timeout=600, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert (Path(ran.stdout.strip().splitlines()[-1]) / "metrics.parquet").is_file()


def test_a_name_registered_twice_is_refused(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    fake_distribution(site, "one", {"raysoft.algorithms": {"fedsoft": "one_mod:Algo"}})
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(small_config()))
    out = tmp_path / "runs"
    ran = subprocess.run([RAYSOFT, "run", str(job), "--out", str(out)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(site)}, timeout=300, cwd=tmp_path)
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert "'fedsoft' is registered twice" in ran.stderr and "by one" in ran.stderr and "by raysoft" in ran.stderr
    assert not out.exists()


NO_ROUND = '''
from raysoft.sdk import AlgorithmConfig, Configured

class Half(Configured[AlgorithmConfig]):
    Settings = AlgorithmConfig
    client_ops = {}
    def init_server(self, ctx): return None
    def init_client(self, ctx): return None
    def centers(self, state): return None
    def weights(self, state): return None
    def eval_payload(self, state): return {}
'''
NOT_SETTINGS = '''
class Odd:
    Settings = dict
'''
NO_HOLDOUT = '''
class Files:
    def __init__(self, settings, seed): pass
    def client(self, k, n, shares): pass
'''
NO_HOOKS = '''
class Quiet:
    def __init__(self, settings, run): pass
'''
NOT_CALLABLE = '''
factory = 3
'''

BAD = [  # (modules, sections, what the one line says)
    ({}, {"algorithm": {"name": "nosuchmodule:X"}}, "cannot import module 'nosuchmodule'"),
    ({"broken.py": "raise RuntimeError('boom at import')\n"}, {"algorithm": {"name": "broken:X"}},
     "importing 'broken' failed: RuntimeError: boom at import"),
    ({"typo.py": "def f(:\n"}, {"algorithm": {"name": "typo:X"}}, "importing 'typo' failed: SyntaxError"),
    ({"serverlr_e.py": SERVER_LR}, {"algorithm": {"name": "serverlr_e:Nope"}}, "has no attribute 'Nope'"),
    ({"half.py": NO_ROUND}, {"algorithm": {"name": "half:Half"}}, "missing method round"),
    ({"serverlr_n.py": SERVER_LR.replace('"evaluate": _evaluate}', "}")},
     {"algorithm": {"name": "serverlr_n:ServerLR"}},
     "algorithm 'serverlr_n:ServerLR': client_ops has no 'evaluate' op (its ops: train); add evaluate("),
    ({"odd.py": NOT_SETTINGS}, {"algorithm": {"name": "odd:Odd"}}, "Settings must be a subclass"),
    ({"serverlr_f.py": SERVER_LR}, {"algorithm": {"name": "serverlr_f:ServerLR", "server_lr": 0}},
     "algorithm.server_lr: Input should be greater than 0"),
    ({"serverlr_g.py": SERVER_LR}, {"algorithm": {"name": "serverlr_g:ServerLR", "server_rate": 1}},
     "algorithm.server_rate: unknown key"),
    ({"files.py": NO_HOLDOUT}, {"data": {"name": "files:Files"}}, "missing method holdout"),
    ({"quiet.py": NO_HOOKS}, {"callbacks": [{"name": "quiet:Quiet"}]}, "missing method on_rows, on_end"),
    ({"factory.py": NOT_CALLABLE}, {"model": {"name": "factory:factory"}}, "must be callable"),
    ({}, {"model": {"name": "nomodel"}}, "model.name: unknown model 'nomodel'"),
    ({}, {"callbacks": [{"name": "tensorboard", "log_dir": "x"}]}, "callbacks.0.log_dir: unknown key"),
]


@pytest.mark.slow
@pytest.mark.parametrize("modules,sections,expected", BAD, ids=[b[2][:40] for b in BAD])
def test_a_bad_plugin_is_one_line_and_exit_2_with_nothing_written(plugdir, tmp_path, modules, sections, expected):
    for name, text in modules.items():
        write(plugdir, name, text)
    cfg = small_config(ray={"backend": "ray", "num_cpus": 1}, **sections)  # refused before Ray would start
    (plugdir / "job.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    ran = subprocess.run([RAYSOFT, "run", "job.yaml", "--out", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.count("\n") == 1 and expected in ran.stderr, ran.stderr
    assert not out.exists()


def test_the_resolver_caches_and_checks_by_kind(plugdir):
    write(plugdir, "serverlr_h.py", SERVER_LR)
    cls = resolve("algorithms", "serverlr_h:ServerLR")
    assert resolve("algorithms", "serverlr_h:ServerLR") is cls
    with pytest.raises(
        PluginError, match="dataset .serverlr_h:ServerLR.: its Settings must be a subclass of raysoft.sdk.DataConfig"
    ):
        resolve("datasets", "serverlr_h:ServerLR")
    with pytest.raises(PluginError, match="unknown kind of plug-in"):
        resolve("optimizers", "adam")


def test_a_config_looks_each_plugin_up_once_and_the_run_reads_its_records(plugdir, tmp_path, monkeypatch):
    """The config's parse looks up every plug-in it names, once; checking, shipping and building
    the run then read those records (``cfg.plugins``, each section's ``plugin``) and look up no
    name again."""
    from raysoft import plugins
    from raysoft.config import parse_config

    write(plugdir, "serverlr_l.py", SERVER_LR)
    made: list[tuple[str, str]] = []

    record = plugins.Plugin

    def counted(kind, name, *rest):
        made.append((kind, name))
        return record(kind, name, *rest)

    monkeypatch.setattr(plugins, "Plugin", counted)
    cfg = parse_config(small_config(algorithm={"name": "serverlr_l:ServerLR"}, callbacks=[{"name": "tensorboard"}]))
    found = {(p.kind, p.name): p for p in cfg.plugins}
    assert sorted(found) == sorted(made) == [("algorithms", "serverlr_l:ServerLR"), ("callbacks", "tensorboard"),
                                             ("datasets", "synthetic"), ("models", "linear")]
    algo = found["algorithms", "serverlr_l:ServerLR"]
    assert algo.by_path and not algo.builtin and algo.settings is type(cfg.algorithm)
    assert all(found[k].builtin and not found[k].by_path for k in found if k[0] != "algorithms")
    assert cfg.algorithm.plugin is algo and algo.load().__name__ == "ServerLR"
    assert plugins.ship_paths(cfg) == [str(plugdir / "serverlr_l.py")]
    run = raysoft.run(cfg.model_copy(update={"callbacks": []}), out=tmp_path / "r")
    assert run.summary["algorithm"] == "serverlr_l:ServerLR"
    assert sorted(made) == sorted(found)  # no plug-in was looked up a second time


def test_a_setting_named_plugin_is_refused_in_one_line(plugdir):
    write(plugdir, "keyed.py", """
        import warnings
        from raysoft.sdk import CallbackConfig
        warnings.simplefilter("ignore")  # pydantic's own warning: the key hides the section's record

        class KeyedConfig(CallbackConfig):
            plugin: int = 1

        class Keyed:
            Settings = KeyedConfig
            def __init__(self, settings, run): pass
            def on_rows(self, rows): pass
            def on_end(self, summary): pass
    """)
    with pytest.raises(raysoft.errors.ConfigError, match="callbacks.0.name: callback 'keyed:Keyed': its settings may "
                       "not have a key named 'plugin'"):
        from raysoft.config import parse_config

        parse_config(small_config(callbacks=[{"name": "keyed:Keyed"}]))


def test_a_section_made_in_code_finds_its_plugin_too():
    """A section not parsed from a config (built in code, or after unpickling on an actor) looks
    its plug-in up when it is first asked."""
    from raysoft.catalog import SyntheticData
    from raysoft.plugins import lookup

    data = SyntheticData(name="synthetic")
    assert data.plugin is lookup("datasets", "synthetic") and data.plugin.settings is SyntheticData


OLD_STREAM_HOOK = '''
from raysoft.sdk import StreamAlgorithm, StreamConfig


class Old(StreamAlgorithm):
    Settings = StreamConfig

    def first_anchor(self, payload): ...
    def receive(self, cs, reply): ...
    def init_server(self, models): ...
    def cold_start(self, state, initial_models): ...
    def server_step(self, state, client, up, scratch, val_sets): ...
    def models(self, state): ...
'''


def test_a_stream_with_the_hooks_old_name_init_server_is_told_the_new_one(plugdir):
    # init_server(models) of a stream shared its name with a synchronous algorithm's init_server(ctx)
    write(plugdir, "oldstream.py", OLD_STREAM_HOOK)
    with pytest.raises(PluginError, match=r"^algorithm 'oldstream:Old': a stream's init_server\(models\) is now "
                                          r"init_stream_server\(models\): rename it$"):
        resolve("algorithms", "oldstream:Old")


@pytest.mark.parametrize("backend", ["inprocess", pytest.param("ray", marks=[pytest.mark.slow, pytest.mark.ray])])
def test_a_client_call_of_an_op_the_plugin_lacks_is_one_line_naming_the_ops(plugdir, tmp_path, backend, request):
    if backend == "ray":
        request.getfixturevalue("ray_session")
    module = f"serverlr_m_{backend}"
    write(plugdir, f"{module}.py", SERVER_LR.replace('yield ClientCall("train"', 'yield ClientCall("trian"'))
    cfg = small_config(algorithm={"name": f"{module}:ServerLR"},
                       ray={"backend": backend, "clients_per_actor": 5, "placement": "none"})
    with pytest.raises(PluginFailure) as err:
        raysoft.run(cfg, out=tmp_path / "out")
    assert str(err.value) == (f"algorithm '{module}:ServerLR': its round 0 asked the clients for op 'trian', which "
                              "is not in its client_ops (evaluate, train)")
    assert not any((tmp_path / "out").iterdir())


def test_a_plugin_without_an_evaluate_op_is_refused_before_anything_starts(plugdir, tmp_path):
    write(plugdir, "serverlr_o.py", SERVER_LR.replace('"evaluate": _evaluate}', "}"))
    with pytest.raises(PluginError, match=r"^algorithm 'serverlr_o:ServerLR': client_ops has no 'evaluate' op "
                                          r"\(its ops: train\); add evaluate\("):
        raysoft.run(small_config(algorithm={"name": "serverlr_o:ServerLR"}), out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_plugin_raising_in_a_client_op_ends_the_run_naming_it_and_the_client(plugdir, tmp_path):
    write(plugdir, "serverlr_i.py", SERVER_LR)
    cfg = small_config(algorithm={"name": "serverlr_i:ServerLR", "clients_per_round": 10, "fail_client": 7})
    with pytest.raises(PluginFailure) as err:
        raysoft.run(cfg, out=tmp_path / "out")
    msg = str(err.value)
    assert "algorithm 'serverlr_i:ServerLR' raised in client op 'train' of client 7, round 0" in msg
    assert f"ValueError: this client's data is bad (at serverlr_i.py:{BAD_LINE})" in msg and "\n" not in msg
    assert not any((tmp_path / "out").iterdir())  # a run without checkpoints leaves nothing


# the line of SERVER_LR's module (as written) where a client's training raises
BAD_LINE = textwrap.dedent(SERVER_LR).splitlines().index('        raise ValueError("this client\'s data is bad")') + 1


def test_a_plugin_failure_with_checkpoints_is_one_line_and_traceback_shows_it_whole(plugdir, tmp_path, capsys,
                                                                                    monkeypatch):
    from raysoft.cli import main as cli_main

    write(plugdir, "serverlr_t.py", SERVER_LR)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config(algorithm={"name": "serverlr_t:ServerLR", "clients_per_round": 10,
                                                          "fail_client": 7}, output={"checkpoint_every": 1})))
    assert cli_main(["run", str(cfg), "--out", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err
    (kept,) = (tmp_path / "a").iterdir()
    assert err == (
        "raysoft: run stopped: algorithm 'serverlr_t:ServerLR' raised in client op 'train' of client 7, round 0: "
        f"ValueError: this client's data is bad (at serverlr_t.py:{BAD_LINE}). The run directory is kept in {kept} "
        f"(no checkpoint yet: resuming starts it again); continue with: raysoft run --resume {kept}.\n")
    for how in (["--traceback"], []):
        if not how:
            monkeypatch.setenv("RAYSOFT_TRACEBACK", "1")
        assert cli_main(["run", str(cfg), "--out", str(tmp_path / f"b{len(how)}"), *how]) == 1
        lines = capsys.readouterr().err.splitlines()
        assert lines[0] == "Traceback (most recent call last):"
        assert f'serverlr_t.py", line {BAD_LINE}, in _train' in "\n".join(lines)
        assert lines[-2] == "ValueError: this client's data is bad"
        assert lines[-1].startswith("raysoft: run stopped: algorithm 'serverlr_t:ServerLR' raised in client op")


@pytest.mark.slow
@pytest.mark.ray
def test_on_ray_the_plugin_is_shipped_to_the_actors_and_its_failure_is_one_line(plugdir, tmp_path, ray_session):
    write(plugdir, "serverlr_j.py", SERVER_LR)
    ray_cfg = {"backend": "ray", "clients_per_actor": 5, "placement": "none"}
    on_ray = raysoft.run(small_config(algorithm={"name": "serverlr_j:ServerLR", "server_lr": 0.5}, ray=ray_cfg),
                         out=tmp_path / "ray")
    here = raysoft.run(small_config(algorithm={"name": "serverlr_j:ServerLR", "server_lr": 0.5}),
                       out=tmp_path / "here")
    pd.testing.assert_frame_equal(values(on_ray), values(here))
    bad = small_config(algorithm={"name": "serverlr_j:ServerLR", "clients_per_round": 10, "fail_client": 3},
                       ray=ray_cfg)
    with pytest.raises(PluginFailure, match=r"raised in client op 'train' of client 3, round 0: ValueError") as err:
        raysoft.run(bad, out=tmp_path / "bad")
    assert str(err.value).endswith(f"serverlr_j.py:{BAD_LINE})")  # the user's line, from the actor
    assert f'serverlr_j.py", line {BAD_LINE}, in _train' in err.value.trace  # --traceback's text came along


def test_the_mlflow_logger_records_every_metric_row(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # as a user has it: raysoft allows its folder
    uri = (tmp_path / "mlruns").as_uri()
    run = raysoft.run(small_config(callbacks=[{"name": "mlflow", "tracking_uri": uri, "experiment": "t"}]),
                      out=tmp_path / "runs")
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # the process's environment left as it was
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for the test's own reading of the store
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    found = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert [r.info.run_name for r in found] == [run.run_id]
    m = pd.read_parquet(run.run_dir / "metrics.parquet")
    row = m[(m.scope == "cluster") & (m.metric == "mse")].iloc[-1]
    key = f"cluster.mse.e{row.entity}.d{row.eval_dist}"
    history = client.get_metric_history(found[0].info.run_id, key)
    assert [(h.step, h.value) for h in history][-1] == (int(row.step), pytest.approx(float(row.value)))
    assert found[0].data.params["algorithm.name"] == "fedsoft"


@pytest.mark.parametrize("given", [None, "./elsewhere"])
def test_the_mlflow_logger_works_as_documented_in_a_users_environment(tmp_path, given):
    # `--set callbacks='[{name: mlflow}]'` failed: MLflow 3 defaults to sqlite:///mlflow.db, which mlflow-skinny
    # cannot open, and a folder store asked for MLFLOW_ALLOW_FILE_STORE=true; the test above set that variable
    # itself, so it passed while a user's run failed
    pytest.importorskip("mlflow")
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump(small_config()))
    entry = "{name: mlflow}" if given is None else f"{{name: mlflow, tracking_uri: {given}}}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    ran = subprocess.run([RAYSOFT, "run", str(cfg), "--out", "runs", "--set", f"callbacks=[{entry}]"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    store = tmp_path / ("mlruns" if given is None else "elsewhere")
    import mlflow

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # for the test's own reading of the store
    try:
        client = mlflow.tracking.MlflowClient(tracking_uri=store.as_uri())
        found = client.search_runs([client.get_experiment_by_name("raysoft").experiment_id])
    finally:
        del os.environ["MLFLOW_ALLOW_FILE_STORE"]
    assert [r.info.run_name for r in found] == [Path(ran.stdout.strip().splitlines()[-1]).name]
    assert any(k.startswith("cluster.mse.") for k in found[0].data.metrics)


def test_raysoft_compare_runs_a_plugin_beside_the_builtins(plugdir, tmp_path):
    write(plugdir, "serverlr_k.py", SERVER_LR)
    from raysoft.compare import compare

    raw = small_config(algorithm={"name": "fedavg", "server_lr": 0.5, "rounds": 2})
    path = compare(raw, ["serverlr_k:ServerLR", "fedavg"], out=tmp_path / "cmp")
    table = pd.read_parquet(path / "comparison.parquet")
    assert list(dict.fromkeys(table.algorithm)) == ["serverlr_k:ServerLR", "fedavg"]
    assert sorted(p.name for p in path.iterdir() if p.is_dir()) == ["ServerLR", "fedavg"]  # no ':' in folders
    saved = yaml.safe_load((path / "ServerLR" / "config.yaml").read_text())
    assert saved["algorithm"]["server_lr"] == 0.5  # the key went to the algorithm that has it
