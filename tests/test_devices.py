"""Device discipline, checked without a GPU: the device a host chooses, moving a client's state,
and two guards over the source against the GPU bugs a CPU run cannot show (a CUDA tensor turned
into numpy directly; a client op making a tensor on the CPU beside its device's data)."""

import ast

import numpy as np
import pytest
import torch
from support.paths import ROOT

from raysoft.algorithms.base import ClientContext
from raysoft.backends.host import _tensors, _to_device_state
from raysoft.devices import choose, to_numpy
from raysoft.errors import ConfigError
from raysoft.optim import Adam

# the files the guards read: the package and the example plug-ins. raysoft/bench is left out: its
# bare loops and peer harnesses are hand-written references that run where they are told
SOURCES = sorted(p for p in [*(ROOT / "raysoft").rglob("*.py"), *(ROOT / "examples").rglob("*.py")]
                 if "bench" not in p.relative_to(ROOT).parts)
FACTORIES = {"as_tensor", "tensor", "from_numpy", "zeros", "ones", "full", "empty", "arange", "eye", "rand",
             "randn", "randint", "linspace"}


def test_to_numpy_takes_tensors_with_grad_and_plain_values():
    t = torch.arange(3.0, requires_grad=True) * 2
    assert to_numpy(t).tolist() == [0.0, 2.0, 4.0]
    assert to_numpy([1, 2]).tolist() == [1, 2]
    assert isinstance(to_numpy(np.zeros(2)), np.ndarray)


def test_choose_by_setting_share_and_cuda(monkeypatch):
    assert choose("cpu").type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose("auto").type == "cpu" and choose("auto", gpu_share=True).type == "cpu"
    with pytest.raises(ConfigError, match="train.device: cuda, but torch finds no CUDA"):
        choose("cuda")
    with pytest.raises(ConfigError, match="no GPU share"):
        choose("cuda", gpu_share=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose("auto").type == "cuda" and choose("auto", gpu_share=True).type == "cuda"
    assert choose("auto", gpu_share=False).type == "cpu"  # an actor without a share stays on the CPU
    assert choose("cpu", gpu_share=True).type == "cpu"


def test_cuda_on_ray_without_gpu_shares_is_refused_before_anything_runs():
    from support.configs import small_config

    from raysoft.config import parse_config

    with pytest.raises(ValueError, match="train.device: cuda needs ray.num_gpus_per_actor > 0"):
        parse_config(small_config(train={"device": "cuda"}, ray={"backend": "ray"}))
    parse_config(small_config(train={"device": "cuda"}, ray={"backend": "inprocess"}))  # checked when the host starts


def test_a_fresh_client_state_moves_whole_to_the_device():
    """Every tensor of a state is found and moved in place: the model's parameters, the
    optimizer's moments (made on the CPU beside them) and plain tensors, each once; the optimizer
    then still holds the model's parameters. (No second device here: what moves is checked.)"""

    class State:
        def __init__(self):
            self.model = torch.nn.Linear(3, 2)
            self.opt = Adam(self.model.parameters(), lr=0.1)
            self.pi = torch.full((2,), 0.5)
            self.counts = np.zeros(2)

    st = State()
    found = {id(t) for t in _tensors(st)}
    wanted = [*st.model.parameters(), *st.opt.exp_avg, *st.opt.exp_avg_sq, st.pi]
    assert found == {id(t) for t in wanted} and len(_tensors(st)) == len(wanted)
    assert _to_device_state(st, torch.device("cpu")) is st
    assert all(a is b for a, b in zip(st.opt.params, st.model.parameters()))


def test_a_client_context_makes_its_models_and_tensors_on_its_device():
    from support.configs import small_config

    from raysoft.config import parse_config
    from raysoft.data import Federation

    cfg = parse_config(small_config())
    fed = Federation(cfg.data, cfg.seed)
    ctx = ClientContext(cfg, 0, fed.client_data(0), fed.info, torch.nn.Linear(1, 1), torch.device("meta"))
    assert all(p.device.type == "meta" for p in ctx.new_model("client_init").parameters())
    assert ctx.tensor(np.ones(3), dtype=torch.float32).device.type == "meta"
    cpu = ClientContext(cfg, 0, fed.client_data(0), fed.info, torch.nn.Linear(1, 1))
    assert cpu.device.type == "cpu"  # the default: a plug-in's own contexts in its tests


def _calls(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]


def test_every_tensor_to_numpy_conversion_goes_through_to_numpy():
    """``tensor.numpy()`` refuses a CUDA tensor: outside raysoft/devices.py no source calls it."""
    found = []
    for path in SOURCES:
        if path.name == "devices.py":
            continue
        for call in _calls(ast.parse(path.read_text())):
            if call.func.attr == "numpy" and not call.args:
                found.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert not found, f"use raysoft.devices.to_numpy (raysoft.sdk.to_numpy) instead of .numpy(): {found}"


def _client_functions(tree: ast.AST):
    """Functions with a client context parameter (``ctx``/``ctxs`` annotated ClientContext):
    client ops, their batched versions and the helpers they call with a context."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in node.args.args + node.args.kwonlyargs:
                if arg.annotation is not None and "ClientContext" in ast.unparse(arg.annotation):
                    yield node
                    break


def test_client_code_makes_its_tensors_on_the_device():
    """A client op's data, state and payload tensors are on the host's device; a tensor it makes
    with a torch factory (``torch.as_tensor``, ``torch.zeros``, ...) without ``device=`` is on the
    CPU, and mixing the two fails on a GPU only. Client code passes ``device=`` (or uses
    ``ctx.tensor``, or a ``*_like`` factory)."""
    found = []
    for path in SOURCES:
        for fn in _client_functions(ast.parse(path.read_text())):
            for call in _calls(fn):
                owner = call.func.value
                if (isinstance(owner, ast.Name) and owner.id == "torch" and call.func.attr in FACTORIES
                        and not any(k.arg == "device" for k in call.keywords)):
                    found.append(f"{path.relative_to(ROOT)}:{call.lineno} torch.{call.func.attr} in {fn.name}")
    assert not found, f"client code making a tensor without device=: {found}"


def test_the_guards_see_what_they_guard():
    """The guards read real client code (so an empty match is not a vacuous pass)."""
    names = {fn.name for p in SOURCES for fn in _client_functions(ast.parse(p.read_text()))}
    assert {"client_estimate", "client_train_batched", "_fpfc_train", "init_client", "step"} <= names
    bad = ast.parse("def op(ctx: ClientContext, s, p, t):\n    return torch.zeros(3), x.numpy()\n")
    assert [c.func.attr for c in _calls(next(_client_functions(bad)))] == ["zeros", "numpy"]
