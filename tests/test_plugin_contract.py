"""The typed plug-in contract of raysoft.sdk: an algorithm with neither ``centers`` nor
``weights`` runs (no center rows, no weight records), ``round`` returns a ``RoundResult``,
``evaluate`` an ``EvalResult`` whose ``extra`` reaches ``absorb_eval``; the earlier forms (a
round's ``(state, dict)`` pair, an evaluate dict's ``_`` keys) and anything else stop the run in
one line that says what to write instead, and the sdk exports the protocols."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from support.configs import small_config

import raysoft
from raysoft.algorithms.base import EvalResult, RoundResult, as_round_result, eval_metrics
from raysoft.errors import PluginFailure
from raysoft.plugins import clear_cache

# FedAvg without centers or weights: every client's model is scored on its own data only.
# FORM picks how round and evaluate answer: "typed" (RoundResult, EvalResult), "legacy" (the
# earlier (state, dict) pair of a round) or "bad" (a round returns its state alone).
MINIMAL = '''
import torch

from raysoft.sdk import (AlgorithmConfig, ClientCall, Configured, EvalResult, RoundResult, WeightedMean,
                         evaluate_vector, get_flat, numpy_rng, scratch_optimizer, train_from, uniform_selection)

FORM = {form!r}


class MinimalConfig(AlgorithmConfig):
    pass


def _train(ctx, opt, payload, t):
    return opt, train_from(ctx, opt, payload["model"], t)


def _evaluate(ctx, opt, payload, t):
    metrics = evaluate_vector(ctx, payload["model"])
    return opt, EvalResult(metrics, extra=10 * ctx.client)


class Minimal(Configured[MinimalConfig]):
    Settings = MinimalConfig
    client_ops = {{"train": _train, "evaluate": _evaluate}}

    def init_server(self, ctx):
        return {{"model": get_flat(ctx.new_model("center", 0)), "seen": {{}}}}

    def init_client(self, ctx):
        return scratch_optimizer(ctx)

    def round(self, ctx, state, t):
        chosen = uniform_selection(ctx.num_clients, self.settings.clients_per_round,
                                   numpy_rng(ctx.cfg.seed, "select", t))
        res = yield ClientCall("train", chosen, {{"model": state["model"]}}, reduce=WeightedMean(ctx.sizes))
        new = {{**state, "model": res.value}}
        step = float(torch.linalg.vector_norm(res.value - state["model"]))
        if FORM == "typed":
            return RoundResult(new, {{"step_norm": step}}, weights_updated=True, trained=len(res.clients))
        if FORM == "legacy":
            return new, {{"trained": len(res.clients), "weights_updated": True, "diagnostics": {{"step_norm": step}}}}
        return new  # neither form: the run stops

    def absorb_eval(self, state, results):
        assert all(isinstance(r, EvalResult) for r in results.values())
        seen = {{k: r.extra for k, r in results.items()}}
        assert seen == {{k: 10 * k for k in results}}
        return {{**state, "seen": seen}}

    def eval_payload(self, state):
        return {{"model": state["model"]}}
'''


@pytest.fixture
def plugdir(tmp_path, monkeypatch):
    d = tmp_path / "plug"
    d.mkdir()
    monkeypatch.chdir(d)
    clear_cache()
    yield d
    clear_cache()


def test_an_algorithm_without_centers_or_weights_runs(plugdir, tmp_path):
    module = "minimal_typed"
    (plugdir / f"{module}.py").write_text(MINIMAL.format(form="typed"))
    run = raysoft.run(small_config(algorithm={"name": f"{module}:Minimal", "rounds": 3, "eval_every": 1}),
                      out=tmp_path / "out")
    metrics = pd.read_parquet(run.run_dir / "metrics.parquet")
    assert set(metrics.scope) == {"client"}  # no center was scored on a holdout set
    assert not any(m.startswith("_") for m in metrics.metric)  # an extra is not a metric
    assert sorted(metrics.step.unique()) == [0, 1, 2, 3] and len(metrics.entity.unique()) == 10
    assert pd.read_parquet(run.run_dir / "weights.parquet").empty  # weights_updated, but no weights
    diag = pd.read_parquet(run.run_dir / "diagnostics.parquet")
    assert list(diag.step) == [0, 1, 2] and set(diag.name) == {"step_norm"} and (diag.value > 0).all()
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["local_mean"]["mse"] > 0 and "distributions" not in summary and "weight_mae" not in summary


@pytest.mark.parametrize("form, what", [("bad", "dict"), ("legacy", "a tuple of 2")])
def test_a_round_returning_anything_but_a_round_result_is_one_line(plugdir, tmp_path, form, what):
    (plugdir / f"minimal_{form}.py").write_text(MINIMAL.format(form=form))
    with pytest.raises(PluginFailure) as err:
        raysoft.run(small_config(algorithm={"name": f"minimal_{form}:Minimal"}), out=tmp_path / "out")
    assert str(err.value) == (f"algorithm 'minimal_{form}:Minimal': its round 0 returned {what}, not a RoundResult: "
                              "return RoundResult(state, diagnostics, weights_updated, trained)")


def test_the_earlier_round_and_evaluate_forms_are_one_line_errors_saying_what_to_write():
    typed = RoundResult("s", trained=1)
    assert as_round_result(typed) is typed
    with pytest.raises(TypeError, match=r"returned a tuple of 2, not a RoundResult: return RoundResult\(state, "):
        as_round_result(("s", {"trained": 3, "weights_updated": True}))
    assert eval_metrics({"mse": 1.0}) == {"mse": 1.0}
    assert eval_metrics(EvalResult({"mse": 1.0, "_kept": 2.0}, extra=2)) == {"mse": 1.0, "_kept": 2.0}
    with pytest.raises(TypeError) as err:
        eval_metrics({"mse": 1.0, "_center": 2, "_seen": 3})
    assert str(err.value) == ("its evaluate op returned a dict with keys starting with '_' (_center, _seen): "
                              "put extras in EvalResult(metrics, extra)")
    with pytest.raises(TypeError, match="not an EvalResult or a dict of metrics"):
        eval_metrics(3.0)


def test_the_sdk_exports_the_protocols_and_what_the_walkthrough_uses():
    import raysoft.sdk as sdk

    for name in ("Algorithm", "Clustered", "StreamAlgorithm", "Dataset", "ModelFactory", "CallbackHooks",
                 "RoundResult", "EvalResult", "ClientOp", "proximal_pull", "ClientContext", "train_from"):
        assert name in sdk.__all__ and getattr(sdk, name) is not None
    anchor = __import__("torch").ones(3)
    assert sdk.proximal_pull(0.0, anchor) == {}
    pull = sdk.proximal_pull(0.5, anchor)
    assert pull["pull_scale"] == 0.5 and pull["pull_target"].tolist() == [0.5, 0.5, 0.5]


def test_an_algorithm_without_configured_is_given_the_optional_attributes_defaults():
    # the engine reads readonly_ops, batched_ops, centers, ... as plain attributes: a plug-in that
    # implements the protocol without Configured gets the defaults of those it lacks, keeps its own
    from raysoft.algorithms.base import OPTIONAL_HOOKS, OptionalHooks, leaves_state, with_defaults

    class Bare:
        stateless_ops = ("unseen",)

        def weights(self, state):
            return None

    algo = with_defaults(Bare())  # type: ignore[arg-type]  # only the optional attributes matter here
    assert algo.stateless_ops == ("unseen",) and algo.weights is not None  # its own
    assert algo.readonly_ops == ("evaluate",) and dict(algo.batched_ops) == {} and algo.own_data is False
    assert algo.centers is None and algo.serve is None and algo.absorb_eval is None and algo.state_types == ()
    assert leaves_state(algo, "evaluate") and leaves_state(algo, "unseen") and not leaves_state(algo, "train")
    assert set(OPTIONAL_HOOKS) == set(OptionalHooks.__annotations__)  # one list of them
