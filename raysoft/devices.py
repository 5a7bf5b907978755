"""Where a host's tensors live, and the one way from a tensor back to numpy.

A client host (a Ray client actor, or the in-process backend's one host) runs its clients on
one device: their data, their states and the payloads they receive are moved there, and their
results come back to the CPU. Client code that makes a tensor of its own makes it on
``ctx.device``; client code that needs numpy converts with :func:`to_numpy`, which copies a
device tensor to the host first (``tensor.numpy()`` refuses a CUDA tensor). Every tensor to
numpy conversion of raysoft goes through :func:`to_numpy`; a test checks that no other remains,
so this class of GPU bug is caught on a machine without one.

``train.device`` chooses the device: ``auto`` is CUDA where the process has it (in-process) or
where Ray gave the actor a GPU share and the actor's torch finds CUDA; ``cpu`` and ``cuda``
force it (``cuda`` without CUDA is an error, never a silent fallback).

On CUDA a run makes its kernels deterministic (:func:`deterministic`: the in-process backend for
the run, a client actor for its life): the same seed gives the
same numbers on any packing of clients into actors and on resume, as on the CPU.
"""

from __future__ import annotations

import ast
import copy
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import ConfigError
from .tree import map_leaves

# cuBLAS needs a fixed workspace for deterministic results; read when CUDA first starts
CUBLAS_WORKSPACE = ":4096:8"


def to_numpy(value: Any) -> np.ndarray:
    """``value`` as a numpy array: a tensor on any device is detached and copied to the host
    (the only tensor -> numpy conversion in raysoft); anything else goes through ``np.asarray``."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` (a tensor, or dicts, lists, tuples and dataclasses of them: a payload, a result,
    a client's data) with every tensor on ``device``; containers whose tensors are all there
    already are returned as they are (:func:`~raysoft.tree.map_leaves`), not copied."""
    return map_leaves(lambda leaf: leaf.to(device) if isinstance(leaf, torch.Tensor) else leaf, obj)


def choose(spec: str, gpu_share: bool | None = None) -> torch.device:
    """The device ``train.device`` = ``spec`` gives a host. ``gpu_share``: on a Ray actor,
    whether Ray gave it a GPU share (None in-process). ``auto``: CUDA where this process has it
    (and, on an actor, a GPU share); ``cuda`` where CUDA is missing, or on an actor without a
    share, raises :class:`~raysoft.errors.ConfigError`."""
    if spec == "cpu":
        return torch.device("cpu")
    has_cuda = torch.cuda.is_available()
    if spec == "cuda":
        if gpu_share is False:
            raise ConfigError("train.device: cuda, but this client actor has no GPU share "
                              "(set ray.num_gpus_per_actor > 0)")
        if not has_cuda:
            raise ConfigError("train.device: cuda, but torch finds no CUDA device in this process "
                              f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        return torch.device("cuda")
    if spec != "auto":
        raise ConfigError(f"train.device: {spec!r} is not one of auto, cpu, cuda")
    return torch.device("cuda") if has_cuda and gpu_share is not False else torch.device("cpu")


def with_index(device: torch.device | str) -> torch.device:
    """``device`` with its index (``cuda`` -> ``cuda:N``, the current one), so that it compares
    equal to its tensors' devices; the CPU as it is."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def prepare_cuda() -> None:
    """Before CUDA starts in this process: cuBLAS's deterministic workspace (a user's own
    setting is kept). Importing raysoft sets it already; where CUDA started before that without
    the setting, cuBLAS has read its workspace and the same seed could give other numbers: an
    error, not a silent difference."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    if torch.cuda.is_initialized() and os.environ["CUBLAS_WORKSPACE_CONFIG"] not in (":4096:8", ":16:8"):
        raise ConfigError(f"CUBLAS_WORKSPACE_CONFIG is {os.environ['CUBLAS_WORKSPACE_CONFIG']!r} and CUDA has "
                          f"started: set it to {CUBLAS_WORKSPACE!r} (or ':16:8') before CUDA starts")


@contextmanager
def deterministic(device: torch.device) -> Iterator[None]:
    """Deterministic kernels on ``device`` while the block runs (nothing to do on the CPU): no
    cuDNN autotuning (it picks kernels by timing), no TF32 (convolutions would round to 10-bit
    mantissas, far from the CPU's numbers), and torch's deterministic algorithms, strict (an op
    without a deterministic kernel raises instead of warning). The process's flags are put back as
    they were when the block ends, so an in-process run leaves its caller's settings alone."""
    if device.type != "cuda":
        yield
        return
    prepare_cuda()
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32, matmul.allow_tf32,
             torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32, matmul.allow_tf32 = False, True, False, False
    torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32, matmul.allow_tf32 = saved[:4]
        torch.use_deterministic_algorithms(saved[4], warn_only=saved[5])


def _state_of(obj: Any) -> dict[str, Any] | None:
    """What pickling ``obj`` keeps of it, as a dict (its ``__getstate__``: an optimizer's without
    the parameters it updates, a stream client's without its data), or None where that is not a
    plain dict of attributes (the object is then a leaf: moved, counted and copied as it is)."""
    if isinstance(obj, type) or not hasattr(obj, "__dict__") or callable(obj):
        return None
    state = obj.__getstate__()
    return state if isinstance(state, dict) else None


def tensors_in(obj: Any, seen: set[int] | None = None) -> list[torch.Tensor]:
    """The tensors of a client state (modules' parameters and buffers, optimizer moments, plain
    tensors in dicts, lists and attributes), each once: what its checkpoint and its moves carry
    (an object's attributes as pickling keeps them, so never the parameters an optimizer updates)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.nn.Module):
        own = [t for t in [*obj.parameters(), *obj.buffers()] if id(t) not in seen]
        seen.update(id(t) for t in own)
        return own
    items: Iterable[Any]
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    else:
        state = _state_of(obj)
        if state is None:
            return []
        items = state.values()
    return [t for v in items for t in tensors_in(v, seen)]


def _tensor_to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``, copied once: asynchronously onto a GPU (from the CPU or another GPU
    stream-ordered, so later work on the device sees it), synchronously off one (a CPU copy is
    read as soon as it is made). A parameter stays a parameter."""
    data = t.detach().to(device, non_blocking=device.type == "cuda")
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(data, requires_grad=t.requires_grad)
    return data.requires_grad_() if t.requires_grad and t.is_leaf else data


def state_to_device(state: Any, device: torch.device) -> Any:
    """A client state with every tensor on ``device``, in one walk that copies each tensor once
    (no deep copy first): the parts whose tensors are all there already are returned as they are
    (the whole state where it is there already), the rest rebuilt around the moved tensors; the
    original stays where it was. Containers as :func:`~raysoft.tree.map_leaves` walks them (dicts,
    lists, tuples); other objects (dataclasses, optimizers, a plug-in's classes) through what
    pickling keeps of them (``__getstate__``), so an optimizer moves its moments without the
    parameters it updates (a host's shared scratch model is never copied into a state) and comes
    back unbound; a module is copied around its moved parameters and buffers. Tensors shared
    within the state stay shared."""
    memo: dict[int, tuple[Any, Any]] = {}  # id -> (the object, kept alive so that its id stays its own; its move)

    def walk(obj: Any) -> Any:
        key = id(obj)
        if key in memo:
            return memo[key][1]
        out = obj
        if isinstance(obj, torch.Tensor):
            out = obj if obj.device == device else _tensor_to(obj, device)
        elif isinstance(obj, torch.nn.Module):
            tensors = [*obj.parameters(), *obj.buffers()]
            if any(t.device != device for t in tensors):
                inner = {id(t): walk(t) for t in tensors}
                out = copy.deepcopy(obj, inner)  # the module's structure; its tensors are the moved ones
        elif isinstance(obj, dict):
            items = {k: walk(v) for k, v in obj.items()}
            if any(items[k] is not v for k, v in obj.items()):
                out = type(obj)(items)
        elif isinstance(obj, (list, tuple)):
            values = [walk(v) for v in obj]
            if any(new is not old for new, old in zip(values, obj)):
                out = type(obj)(*values) if hasattr(obj, "_fields") else type(obj)(values)
        else:
            state = _state_of(obj)
            if state is not None:
                new_state = {k: walk(v) for k, v in state.items()}
                if any(new_state[k] is not v for k, v in state.items()):
                    cls: Any = type(obj)
                    out = cls.__new__(cls)  # as pickling makes it (copyreg.__newobj__), then its state
                    if hasattr(out, "__setstate__"):
                        out.__setstate__(new_state)
                    else:
                        out.__dict__.update(new_state)
        memo[key] = (obj, out)
        return out

    return walk(state)


# torch's factories: without ``device=`` they make a tensor on the CPU
FACTORIES = frozenset({"as_tensor", "tensor", "from_numpy", "zeros", "ones", "full", "empty", "arange", "eye",
                       "rand", "randn", "randint", "linspace"})


def _method_calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]


def _attr(call: ast.Call) -> str:
    """The attribute a method call calls (``x.numpy()`` -> ``numpy``)."""
    return getattr(call.func, "attr", "")


def client_functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions of a module with a parameter annotated ``ClientContext`` (or a list of them):
    client ops, their batched versions and the helpers they call with a context."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            if any(a.annotation is not None and "ClientContext" in ast.unparse(a.annotation) for a in args):
                yield node


def device_slips(paths: Iterable[str | Path]) -> list[str]:
    """The places in these Python files that would fail on a GPU only, as ``file:line what``:
    a ``.numpy()`` call (use :func:`to_numpy`), and in client code (:func:`client_functions`) a
    torch factory without ``device=`` (use ``ctx.tensor`` or ``device=ctx.device``). raysoft's
    tests run it over raysoft and its examples; a plug-in author can run it over theirs."""
    found = []
    for path in map(Path, paths):
        tree = ast.parse(path.read_text(), filename=str(path))
        for call in _method_calls(tree):
            if _attr(call) == "numpy" and not call.args and path.name != "devices.py":
                found.append(f"{path}:{call.lineno} .numpy() (use to_numpy)")
        for fn in client_functions(tree):
            for call in _method_calls(fn):
                owner = getattr(call.func, "value", None)
                if (isinstance(owner, ast.Name) and owner.id == "torch" and _attr(call) in FACTORIES
                        and not any(k.arg == "device" for k in call.keywords)):
                    found.append(f"{path}:{call.lineno} torch.{_attr(call)} without device= in {fn.name}")
    return found
