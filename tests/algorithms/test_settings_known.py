"""Settings are known, not sent: every host has the run's config from its start, so a client op
reads the algorithm's settings with ``ctx.settings(Kind)`` and a payload carries only the run's
state (what changes between rounds). ``comm.parquet`` counts payload bytes, so a setting sent in
a payload would be counted as downloaded by every client, every call.

The guard runs each built-in synchronous algorithm (and the FedProx example) in-process, with
held-out clients (so that the cold start's payload is sent too), and records every payload a
client host is asked to run an op with: the rounds' calls, the evaluations, the served models
and the cold starts. No payload may have a key named like a field of the algorithm's settings,
nor a plain value (a string, a number) equal to one of the settings' values under another name.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping

import numpy as np
import pytest
import torch
from support.configs import small_config
from support.paths import EXAMPLES

import raysoft
from raysoft.algorithms.base import ClientContext
from raysoft.algorithms.settings import FedSoftConfig, IFCAConfig
from raysoft.backends.host import ClientHost
from raysoft.config import AlgorithmConfig, parse_config
from raysoft.data import ClientData
from raysoft.models import DataInfo

# each built-in synchronous algorithm, in the settings whose client ops read the most of them
# (fpfc's first run in a session costs ~8 s of start-up: slow)
RUNS = {
    "fedsoft": {"name": "fedsoft", "num_centers": 2},
    "fedsoft_mixture_full": {"name": "fedsoft", "num_centers": 2, "start": "mixture", "selection": "full",
                             "sigma": 0.01, "prox_weight": 0.5},
    "ifca": {"name": "ifca", "num_centers": 2, "init_threshold": 0.2},
    "ifca_gradient": {"name": "ifca", "num_centers": 2, "option": "gradient"},
    "ifca_oracle": {"name": "ifca", "num_centers": 2, "assignment": "oracle"},
    "fedem": {"name": "fedem", "num_centers": 2, "unseen_em_steps": 3},
    "fpfc": {"name": "fpfc"},
    "fedavg": {"name": "fedavg"},
    "local": {"name": "local"},
}
OPS = {"train", "evaluate", "unseen"}  # every op each case must have been called with (and these)
MORE_OPS = {"fedsoft": {"estimate"}, "fedsoft_mixture_full": {"estimate"}, "ifca": {"assign"}}


def scalar_leaves(value: object, where: str = "") -> Iterator[tuple[str, object]]:
    """(path, value) of every plain value (str, bool, int, float) inside a payload's entry;
    tensors and arrays are state, not settings, and are skipped."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from scalar_leaves(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from scalar_leaves(v, f"{where}[{i}]")
    elif isinstance(value, (str, bool, int, float)):
        yield where, value


def setting_values(settings: AlgorithmConfig) -> dict[str, object]:
    """The settings' plain values by field name (the name, which the op's name carries, left out)."""
    return {k: v for k, v in settings.model_dump().items()
            if k != "name" and isinstance(v, (str, int, float)) and not isinstance(v, bool)}


def sent_settings(op: str, payload: Mapping[str, object], settings: AlgorithmConfig) -> list[str]:
    """What of ``settings`` the payload of ``op`` sends: keys named like a field, and plain values
    equal to a setting's (a string equal to a string setting, a number to a number setting)."""
    fields = set(type(settings).model_fields)
    out = [f"{op}: key {k!r} is a setting" for k in payload if k in fields]
    values = setting_values(settings)
    for k, v in payload.items():
        if k in fields:
            continue  # said already
        for path, leaf in scalar_leaves(v, f"[{k!r}]"):
            for name, s in values.items():
                if isinstance(leaf, str) == isinstance(s, str) and type(leaf) is not bool and leaf == s:
                    out.append(f"{op}: payload{path} = {leaf!r} is the setting {name}")
    return out


@pytest.fixture()
def payloads(monkeypatch) -> list[tuple[str, dict]]:
    """Every (op, payload) a ClientHost is asked to run (a reduced call's too: it calls ``call``)."""
    seen: list[tuple[str, dict]] = []
    call = ClientHost.call

    def spy(self, op, ids, payload, *args, **kw):
        seen.append((op, payload))
        return call(self, op, ids, payload, *args, **kw)

    monkeypatch.setattr(ClientHost, "call", spy)
    return seen


def _run(tmp_path, algorithm: dict) -> AlgorithmConfig:
    """Run ``algorithm`` on the small config with two held-out clients (so that the cold start's
    payload is sent too); its settings."""
    cfg = small_config(algorithm=algorithm)
    cfg["data"] = {**cfg["data"], "held_out": 0.2}
    raysoft.run(cfg, out=tmp_path)
    return parse_config(cfg).algorithm


def check(payloads: list[tuple[str, dict]], settings: AlgorithmConfig, ops: set[str]) -> None:
    called = {op for op, _ in payloads}
    assert ops <= called, f"not every op of the algorithm was called: {sorted(ops - called)}"
    problems = [p for op, payload in payloads for p in sent_settings(op, payload, settings)]
    assert not problems, "settings are known, not sent (read them with ctx.settings):\n" + "\n".join(problems)


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "fpfc" else c for c in RUNS])
def test_no_built_in_sends_a_setting_in_a_payload(tmp_path, payloads, case):
    check(payloads, _run(tmp_path, RUNS[case]), OPS | MORE_OPS.get(case, set()))


def test_the_fedprox_example_sends_no_setting(tmp_path, payloads, monkeypatch):
    monkeypatch.chdir(EXAMPLES / "fedprox")
    try:
        settings = _run(tmp_path, {"name": "fedprox:FedProx", "mu": 0.25})
    finally:
        sys.modules.pop("fedprox", None)
    check(payloads, settings, OPS)


def test_the_guard_finds_a_setting_by_its_key_and_by_its_value():
    """Not a vacuous pass: the payloads FedSoft and IFCA used to send are caught."""
    fedsoft = FedSoftConfig(num_centers=2)
    centers, u = torch.zeros(2, 3), np.zeros((4, 2))
    assert sent_settings("estimate", {"centers": centers, "sigma": fedsoft.sigma}, fedsoft) == [
        "estimate: key 'sigma' is a setting"]
    old_train = {"centers": centers, "u": u, "prox_weight": fedsoft.prox_weight, "start": fedsoft.start}
    assert sent_settings("train", old_train, fedsoft) == ["train: key 'prox_weight' is a setting",
                                                          "train: key 'start' is a setting"]
    assert sent_settings("train", {"centers": centers, "lam": 1.0}, fedsoft) == [
        "train: payload['lam'] = 1.0 is the setting prox_weight"]
    ifca = IFCAConfig(num_centers=2)
    assert sent_settings("train", {"centers": centers, "rule": {"how": "loss"}}, ifca) == [
        "train: payload['rule']['how'] = 'loss' is the setting assignment"]
    assert sent_settings("train", {"centers": centers, "u": u}, fedsoft) == []  # state only


def _context(algorithm: dict) -> ClientContext:
    cfg = parse_config({"algorithm": algorithm, "data": {"clients": 2}})
    data = ClientData(torch.zeros(1, 1), torch.zeros(1), np.zeros(1, dtype=int))
    return ClientContext(cfg=cfg, client=0, data=data, info=DataInfo(input_dim=1, num_outputs=1, task="regression"),
                         scratch=torch.nn.Linear(1, 1))


def test_a_client_op_reads_its_settings_typed_from_its_context():
    ctx = _context({"name": "fedsoft", "sigma": 0.125, "clients_per_round": 1})
    assert ctx.settings(FedSoftConfig) is ctx.cfg.algorithm and ctx.settings(FedSoftConfig).sigma == 0.125
    assert ctx.settings(AlgorithmConfig) is ctx.cfg.algorithm  # a base of the settings' class will do
    with pytest.raises(TypeError, match=r"^ctx.settings\(IFCAConfig\): the run's algorithm settings are "
                                        r"FedSoftConfig, not IFCAConfig$"):
        ctx.settings(IFCAConfig)
