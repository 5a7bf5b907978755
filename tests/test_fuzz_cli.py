"""Property test of the command line: drawn configs, ``--set`` values, arguments and plug-in
shapes given to ``raysoft run`` and ``raysoft compare`` are either accepted or refused with one
line on stderr, exit code 2 and nothing written.

What an accepted command would then run is replaced by a recorder (the runs themselves are
tested elsewhere): ``raysoft run`` goes through every check of :func:`raysoft.run` (data files,
plug-ins, the output folder, resources) up to its first write, ``raysoft compare`` through
every check of :func:`raysoft.compare.compare` up to its first run. ``make test`` runs a fixed
set of examples (derandomised); ``make test-all`` also runs many random ones
(``RAYSOFT_FUZZ_EXAMPLES``, default 300).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.configs import small_config

import raysoft.api
import raysoft.compare
from raysoft.cli import main as cli_main
from raysoft.config import DataConfig, ModelConfig, OutputConfig, RayConfig, TrainConfig
from raysoft.plugins import clear_cache, registered, settings_class

SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "ray": RayConfig, "output": OutputConfig}
ALGORITHM_KEYS = sorted({k for name in registered("algorithms")
                         for k in settings_class("algorithms", name).model_fields})
KEYS = ([f"algorithm.{k}" for k in ALGORITHM_KEYS] + [f"{s}.{k}" for s, m in SECTIONS.items() for k in m.model_fields]
        + ["seed", "faults", "regimes", "algorithm", "data", "bogus.key", "algorithm.bogus", "", ".", "a..b"])
# ray.address and the join keys would try the network; what joining does is tested in tests/backends/test_join.py
KEYS = [k for k in KEYS if k not in ("ray.address", "ray.backend", "ray.join_timeout_s")]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 300), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6), st.sampled_from(["10:90", "random", "linear", "cnn", "logistic", "sgd", "adam", "fedavg",
                                          "ifca", "fedem", "ccfl", "nope", "none", "fmnist", "synthetic"]),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.sampled_from(["name", "lr", "x"]),
                                                                           scalars, max_size=2))


def as_text(value) -> str:
    """A ``--set`` value as a user would type it: YAML in flow style, or raw text."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()


overrides = st.lists(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS), st.one_of(values.map(as_text),
                                                                                         st.text(max_size=6))),
                     max_size=3)

# the shapes of a plug-in algorithm: each required part present or not
PLUGIN_PARTS = {
    "settings": "    Settings = FuzzConfig\n",
    "init_server": "    def init_server(self, ctx):\n        return get_flat(ctx.new_model('center', 0))\n",
    "init_client": "    def init_client(self, ctx):\n        return None\n",
    "round": ("    def round(self, ctx, state, t):\n"
              "        yield ClientCall(OP, list(range(ctx.num_clients)), {})\n"
              "        return RoundResult(state)\n"),
    "centers": "    def centers(self, state):\n        return state[None, :]\n",
    "weights": "    def weights(self, state):\n        return None\n",
    "eval_payload": "    def eval_payload(self, state):\n        return {}\n",
}
OPS = {"train": "_op", "evaluate": "_op"}
plugins = st.fixed_dictionaries({
    "parts": st.sets(st.sampled_from(sorted(PLUGIN_PARTS))),
    "ops": st.one_of(st.sets(st.sampled_from(sorted(OPS))), st.just("not a dict")),
    "settings_base": st.sampled_from(["AlgorithmConfig", "DataConfig", "dict"]),
    "call": st.sampled_from(["train", "trian"]),
})


def plugin_text(shape: dict) -> str:
    ops = (repr(shape["ops"]) if isinstance(shape["ops"], str)
           else "{" + ", ".join(f"{op!r}: _op" for op in sorted(shape["ops"])) + "}")
    body = "".join(PLUGIN_PARTS[p] for p in sorted(shape["parts"]))
    return ("from raysoft.sdk import AlgorithmConfig, ClientCall, DataConfig, RoundResult, get_flat\n\n"
            f"OP = {shape['call']!r}\n\n\ndef _op(ctx, state, payload, t):\n    return state, {{}}\n\n\n"
            f"class FuzzConfig({shape['settings_base']}):\n    pass\n\n\nclass Fuzz:\n"
            f"    client_ops = {ops}\n{body}    def __init__(self, settings):\n        self.settings = settings\n")


configs = st.one_of(
    st.builds(lambda algo: small_config(algorithm={"name": algo}),
              st.sampled_from(["fedsoft", "fedavg", "ifca", "fedem", "local", "ccfl", "nope"])),
    st.just(None),  # a config file that is not there
    st.sampled_from(["", "[1, 2]", "algorithm: {name: fedavg", "seed: x", "42"]),  # not a mapping of sections
    plugins,
)
extras = st.lists(st.sampled_from([["--progress", "bar"], ["--progress", "loud"], ["--algorithms", "fedavg,ifca"],
                                   ["--algorithms", "fedavg,fedavg"], ["--algorithms", ""], ["--resume", "nowhere"],
                                   ["--bogus"], ["--out"], ["--set"], ["--traceback"]]),
                  max_size=2).map(lambda parts: list(itertools.chain.from_iterable(parts)))
commands = st.fixed_dictionaries({"command": st.sampled_from(["run", "compare"]), "config": configs,
                                  "overrides": overrides, "extras": extras})

_counter = itertools.count()


def _accepted(*args, **kwargs):
    raise _Accepted


class _Accepted(Exception):
    """What a command would do once everything is checked: the test stops it there."""


def _run_local(cfg, progress, dir_name):
    raise _Accepted


def check(case: dict) -> None:
    """Run the drawn command line; it is accepted, or refused in one line with exit 2 and
    nothing written."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out = root / "out"
        config = case["config"]
        path = root / "job.yaml"
        if isinstance(config, dict) and "parts" in config:  # a plug-in algorithm, in a module of its own
            module = f"fuzz_plugin_{os.getpid()}_{next(_counter)}"
            (root / f"{module}.py").write_text(plugin_text(config))
            path.write_text(yaml.safe_dump(small_config(algorithm={"name": f"{module}:Fuzz"})))
        elif isinstance(config, dict):
            path.write_text(yaml.safe_dump(config))
        elif isinstance(config, str):
            path.write_text(config)
        argv = [case["command"], str(path)]
        for o in case["overrides"]:
            argv += ["--set", o]
        argv += ["--out", str(out), *case["extras"]]
        err = io.StringIO()
        sys.path.insert(0, str(root))
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    code = cli_main(argv)
                except SystemExit as stop:  # argparse's own one-line refusal
                    code = stop.code
                except _Accepted:
                    return
        finally:
            sys.path.remove(str(root))
            clear_cache()
        written = err.getvalue()
        assert code == 2, (argv, code, written)
        if "--traceback" in argv:  # the whole traceback, then the one line
            written = written.splitlines(keepends=True)[-1] if written else written
        assert written.count("\n") == 1 and written.startswith("raysoft"), (argv, written)
        assert not out.exists() or not any(out.iterdir()), (argv, sorted(out.rglob("*")))


@pytest.fixture(autouse=True)
def _stop_before_running(monkeypatch):
    monkeypatch.setattr(raysoft.api, "_run_local", _run_local)
    monkeypatch.setattr(raysoft.compare, "_run_all", _accepted)
    monkeypatch.setattr(raysoft.compare, "resume_compare", _accepted)
    monkeypatch.delenv("RAYSOFT_TRACEBACK", raising=False)


COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@settings(max_examples=60, derandomize=True, **COMMON)
@given(commands)
def test_command_lines_are_accepted_or_refused_in_one_line(case):
    check(case)


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("RAYSOFT_FUZZ_EXAMPLES", "300")), **COMMON)
@given(commands)
def test_many_more_command_lines_are_accepted_or_refused_in_one_line(case):
    check(case)
