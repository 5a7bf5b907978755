"""Device discipline, checked without a GPU: the device a host chooses, moving a client's state,
and two guards over the source against the GPU bugs a CPU run cannot show (a CUDA tensor turned
into numpy directly; a client op making a tensor on the CPU beside its device's data)."""

import ast
import io

import numpy as np
import pytest
import torch
from support.configs import small_config
from support.paths import ROOT

from raysoft.algorithms.base import ClientContext
from raysoft.data.drift import CycleData
from raysoft.devices import (
    choose,
    client_functions,
    device_slips,
    state_to_device,
    tensors_in,
    to_device,
    to_numpy,
)
from raysoft.errors import ConfigError
from raysoft.optim import SGD, Adam

# the files the guards read: the package and the example plug-ins. raysoft/bench is left out: its
# bare loops and peer harnesses are hand-written references that run where they are told
SOURCES = sorted(p for p in [*(ROOT / "raysoft").rglob("*.py"), *(ROOT / "examples").rglob("*.py")]
                 if "bench" not in p.relative_to(ROOT).parts)


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


class _State:
    def __init__(self):
        self.model = torch.nn.Linear(3, 2)
        self.opt = Adam(self.model.parameters(), lr=0.1)
        self.pi = torch.full((2,), 0.5)
        self.counts = np.zeros(2)


def test_a_client_state_moves_whole_to_the_device():
    """Every tensor of a state is found and moved: the model's parameters, the optimizer's
    moments and plain tensors, each once; what is not a tensor stays. The moved optimizer is
    unbound (a client op binds it to the model it trains); the original is left as it was, and a
    state already on the device comes back itself."""
    cpu, meta = torch.device("cpu"), torch.device("meta")
    st = _State()
    found = {id(t) for t in tensors_in(st)}
    wanted = [*st.model.parameters(), *st.opt.exp_avg, *st.opt.exp_avg_sq, st.pi]
    assert found == {id(t) for t in wanted} and len(tensors_in(st)) == len(wanted)
    assert state_to_device(st, cpu) is st
    out = state_to_device(st, meta)
    assert type(out) is _State and out.counts is st.counts
    assert {t.device for t in tensors_in(out)} == {meta} and len(tensors_in(out)) == len(wanted)
    assert all(isinstance(p, torch.nn.Parameter) for p in out.model.parameters())
    assert out.opt.params == [] and out.opt.lr == 0.1 and out.opt.steps == 0
    assert out.opt.bind(out.model.parameters()).params == list(out.model.parameters())
    assert {t.device for t in tensors_in(st)} == {cpu}  # the original stays
    assert all(a is b for a, b in zip(st.opt.params, st.model.parameters()))
    shared = {"a": st.pi, "b": [st.pi]}  # a tensor shared within a state stays shared
    moved = state_to_device(shared, meta)
    assert moved["a"] is moved["b"][0]


def _moved_bytes(monkeypatch, states, device):
    """``states`` moved to ``device`` one by one, and the bytes of the tensors the move copied."""
    from raysoft import devices

    copied = []
    real = devices._tensor_to
    monkeypatch.setattr(devices, "_tensor_to", lambda t, d: copied.append(t.nbytes) or real(t, d))
    return [state_to_device(st, device) for st in states], sum(copied)


@pytest.mark.parametrize("kind", ["sgd", "sgd+momentum", "adam"])
def test_a_moved_state_carries_no_copy_of_the_shared_scratch_model(monkeypatch, kind):
    """Ten clients' optimizer states over one 1000x100 scratch model (as ``scratch_optimizer``
    makes them), moved one by one: only their moments are copied, never the scratch model they
    are bound to (before, each moved state carried a copy of it: 10 x 0.4 MB); the moved states
    hold no tensor of the scratch model's size beyond their moments, and bound again they train."""
    scratch = torch.nn.Linear(1000, 100, bias=False)
    make = {"sgd": lambda: SGD(scratch.parameters(), lr=0.1),
            "sgd+momentum": lambda: SGD(scratch.parameters(), lr=0.1, momentum=0.9),
            "adam": lambda: Adam(scratch.parameters(), lr=0.1)}[kind]
    states = [make() for _ in range(10)]
    scratch(torch.ones(1, 1000)).sum().backward()
    for opt in states:  # one step each: SGD's momentum buffer exists
        opt.step()
    moments = {"sgd": 0, "sgd+momentum": 1, "adam": 2}[kind] * scratch.weight.nbytes
    moved, copied = _moved_bytes(monkeypatch, states, torch.device("meta"))
    assert copied == 10 * moments
    # with no moments (plain SGD) nothing moves: the state is itself; else a copy, unbound
    assert all(new is old if not moments else new.params == [] for new, old in zip(moved, states))
    assert sum(t.nbytes for opt in moved for t in tensors_in(opt)) == 10 * moments
    assert all(t.device.type == "meta" for opt in moved for t in tensors_in(opt))
    # a state's pickle (a checkpoint's, a spilled state's, a Ray transfer's) holds its moments alone
    buf = io.BytesIO()
    torch.save(states, buf)
    assert buf.tell() < 10 * moments + 100_000
    back = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert all(opt.params == [] for opt in back)
    other = torch.nn.Linear(1000, 100, bias=False)  # bound again (a client op's scratch), it steps that
    other(torch.ones(1, 1000)).sum().backward()
    before = other.weight.detach().clone()
    back[0].bind(other.parameters()).step()
    assert back[0].params[0] is other.weight and not torch.equal(other.weight, before)
    with pytest.raises(RuntimeError, match="bound to no parameters"):
        back[1].step()


def test_payloads_results_and_data_move_to_a_device_containers_and_all():
    """``to_device``: every tensor of dicts, lists, tuples and dataclasses moves; what is not a tensor
    stays; a container already on the device comes back itself, not a copy."""
    cpu, meta = torch.device("cpu"), torch.device("meta")
    data = CycleData(torch.ones(3, 2), torch.zeros(3), torch.ones(1, 2), torch.zeros(1), np.array([0.25, 0.75]))
    payload = {"w": torch.ones(4), "sets": [(torch.ones(2, 2), torch.zeros(2))], "round": 3, "data": data}
    assert to_device(payload, cpu) is payload and to_device(data, cpu) is data
    out = to_device(payload, meta)
    assert [t.device for t in (out["w"], *out["sets"][0], out["data"].x, out["data"].test_y)] == [meta] * 5
    assert isinstance(out["sets"][0], tuple) and isinstance(out["data"], CycleData) and out["round"] == 3
    assert out["data"].shares is data.shares and payload["w"].device == cpu  # the input is left as it was


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


def test_no_source_of_raysoft_or_its_examples_would_fail_on_a_gpu_only():
    """``tensor.numpy()`` refuses a CUDA tensor (outside raysoft/devices.py nothing calls it), and a
    client op's data, state and payload tensors are on the host's device, so a tensor it makes with
    a torch factory without ``device=`` (on the CPU) fails on a GPU only when the two meet."""
    assert device_slips(SOURCES) == []


def test_the_guard_finds_each_slip(tmp_path):
    """The guard reads real client code (an empty answer is not a vacuous pass) and finds both
    kinds of slip, in client code only for the factories."""
    names = {fn.name for p in SOURCES for fn in client_functions(ast.parse(p.read_text()))}
    assert {"client_estimate", "client_train_batched", "_fpfc_train", "init_client", "step"} <= names
    bad = tmp_path / "plugin.py"
    bad.write_text("def op(ctx: ClientContext, s, p, t):\n    return torch.zeros(3), torch.ones(2, device=ctx.device)\n"
                   "def server(state):\n    return torch.zeros(3), state.numpy()\n")
    assert device_slips([bad]) == [f"{bad}:4 .numpy() (use to_numpy)", f"{bad}:2 torch.zeros without device= in op"]


def test_deterministic_flags_hold_in_the_block_strictly_and_are_put_back(monkeypatch):
    from raysoft.devices import deterministic

    cudnn = torch.backends.cudnn
    monkeypatch.setattr(cudnn, "benchmark", True)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    with deterministic(torch.device("cuda")):  # flags only: no CUDA needed to set them
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()  # an error, not a warning
        assert (cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32) == (False, True, False)
        assert not torch.backends.cuda.matmul.allow_tf32
    assert cudnn.benchmark is True
    now = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    assert now == before
    with deterministic(torch.device("cpu")):  # nothing to set on the CPU
        assert torch.are_deterministic_algorithms_enabled() == before[0]


def test_cublas_workspace_is_set_on_import_and_a_late_one_is_refused(monkeypatch):
    import os

    import raysoft.devices as devices

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == devices.CUBLAS_WORKSPACE  # raysoft's import set it
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # as if CUDA had started before
    with pytest.raises(ConfigError, match="CUBLAS_WORKSPACE_CONFIG is ':0:0' and CUDA has started"):
        devices.prepare_cuda()


def test_an_inprocess_run_leaves_its_callers_flags_alone(tmp_path, monkeypatch):
    import raysoft
    from raysoft import devices

    seen = []
    real = devices.deterministic

    def spy(device):
        seen.append(device.type)
        return real(torch.device("cuda"))  # the flags a GPU run sets, on this CPU

    monkeypatch.setattr("raysoft.backends.inprocess.deterministic", spy)
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    enabled = torch.are_deterministic_algorithms_enabled()
    raysoft.run(small_config(algorithm={"name": "fedavg", "rounds": 1}), out=tmp_path)
    assert seen == ["cpu"]
    assert (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) == (
        enabled, warn_only)
