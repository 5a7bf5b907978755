"""What each client receives and sends: the bytes of ``comm.parquet`` and of the summary.

A synchronous round is counted from the :class:`~raysoft.algorithms.ClientCall` requests its
``round`` yields: every client a call is sent to receives the call's payload ("down"), and every
client whose result comes back sent that result ("up"). What is counted is what a deployment
would carry for that client, not the simulator's own traffic (a sum made where the clients run,
a payload put once for an actor's many clients): the payload once per client it is sent to (a
broadcast of S centers to 10 clients is 10 downloads of S centers), minus the entries named in
the call's ``each``, of which a client receives only its own entry. The evaluations the engine
runs to measure a model are not counted: they score what the clients already have.

Sizes (:func:`wire_bytes`) are the sizes of the values themselves, no serialisation: a tensor or
array its elements (float32: 4 bytes each), a Python number 8 bytes (a bool 1), a string its
UTF-8 bytes, ``None`` nothing; containers (:mod:`raysoft.tree`) the sum of their leaves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import PluginFailure
from ..tree import leaves

if TYPE_CHECKING:
    from ..results import Recorder


def wire_bytes(obj: Any) -> int:
    """The bytes ``obj`` carries (nested dicts, lists, tuples, dataclasses): tensors and arrays by
    their elements (``numel * element_size``, read from their shapes, never copied), numpy
    scalars by their item size, Python ints and floats 8 bytes, bools 1, strings and bytes their
    length in bytes (UTF-8), ``None`` and any other object 0."""
    # the containers of raysoft.tree.leaves, walked by plain recursion (a generator per level
    # costs more than the sizes themselves: a round of 10,000 results is counted in milliseconds)
    kind = type(obj)  # exact types first: isinstance against torch.Tensor is slow
    if kind is tuple or kind is list:
        return sum(map(wire_bytes, obj))
    if kind is float or kind is int:
        return 8
    if kind is torch.Tensor:
        return obj.numel() * obj.element_size()
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return _leaf_bytes(obj)
    if isinstance(obj, dict):
        return sum(wire_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(wire_bytes(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(wire_bytes(leaf) for leaf in leaves(obj))
    return _leaf_bytes(obj)


def _leaf_bytes(leaf: object) -> int:
    if isinstance(leaf, torch.Tensor):
        return leaf.numel() * leaf.element_size()
    if isinstance(leaf, (np.ndarray, np.generic)):
        return int(leaf.nbytes)
    if isinstance(leaf, bool):
        return 1
    if isinstance(leaf, (int, float)):
        return 8
    if isinstance(leaf, complex):
        return 16
    if isinstance(leaf, str):
        return len(leaf.encode())
    if isinstance(leaf, (bytes, bytearray)):
        return len(leaf)
    return 0


def download_bytes(payload: Mapping[str, Any], clients: Iterable[int], each: tuple[str, ...] | str = (),
                   where: str = "a client call") -> dict[int, int]:
    """{client: bytes it receives} of one call: the payload's shared entries (all but ``each``),
    counted once, plus, for every key of ``each`` (one key may be given as a string), the client's
    own entry ``payload[key][client]`` (a dict keyed by client id, or an array / tensor / list
    whose first axis is the client)."""
    each = (each,) if isinstance(each, str) else tuple(each)
    missing = [key for key in each if key not in payload]
    if missing:
        raise PluginFailure(f"{where}: its each names {missing[0]!r}, which is not a key of its payload "
                            f"({', '.join(map(repr, payload)) or 'none'})")
    shared = wire_bytes({k: v for k, v in payload.items() if k not in each})
    rows = [key for key in each if isinstance(payload[key], (torch.Tensor, np.ndarray))]
    for key in rows:  # an array's rows are all the same size
        value = payload[key]
        shared += _leaf_bytes(value[0]) if value.ndim and len(value) else 0
    others = [key for key in each if key not in rows]
    out: dict[int, int] = {}
    for k in clients:
        own = 0
        for key in others:
            try:
                own += wire_bytes(payload[key][k])
            except (KeyError, IndexError, TypeError) as err:
                raise PluginFailure(f"{where}: payload[{key!r}] (in its each) has no entry for client {k} "
                                    f"({type(err).__name__})") from None
        out[int(k)] = shared + own
    for key in rows:
        value = payload[key]
        outside = [k for k in out if not 0 <= k < (len(value) if value.ndim else 0)]
        if outside:
            raise PluginFailure(f"{where}: payload[{key!r}] (in its each) has no entry for client {outside[0]} "
                                f"(its shape is {tuple(value.shape)})")
    return out


class Ledger:
    """One round's bytes per client (a stream: one upload's), both directions; the clients a
    call is sent to in the order the engine first meets them."""

    def __init__(self) -> None:
        self.down: dict[int, int] = {}
        self.up: dict[int, int] = {}

    def sent(self, sizes: Mapping[int, int]) -> None:
        """Each client of ``sizes`` received that many bytes."""
        for k, n in sizes.items():
            self.down[k] = self.down.get(k, 0) + int(n)
            self.up.setdefault(k, 0)

    def returned(self, k: int, n: int) -> None:
        """Client ``k`` sent ``n`` bytes back."""
        self.up[k] = self.up.get(k, 0) + int(n)
        self.down.setdefault(k, 0)

    def write(self, recorder: Recorder, step: int) -> None:
        """Rows of ``comm.parquet`` at ``step``, client by client: down, then up."""
        ids = sorted(self.down)
        cols = recorder.columns["comm"]  # extended column by column: Recorder.add's checks, once
        cols["run_id"].extend([recorder.run_id] * (2 * len(ids)))
        cols["step"].extend([step] * (2 * len(ids)))
        cols["client"].extend(k for k in ids for _ in (0, 1))
        cols["direction"].extend(["down", "up"] * len(ids))
        cols["bytes"].extend(n for k in ids for n in (self.down[k], self.up[k]))


def totals(recorder: Recorder, num_clients: int) -> dict[str, float]:
    """The summary's cumulative bytes, summed from the ``comm`` rows recorded so far (a resumed
    run's rows included): ``bytes_down`` and ``bytes_up`` over every client and step, and their
    mean per client of the federation (``/ num_clients``, clients never selected included)."""
    cols = recorder.columns["comm"]
    out: dict[str, float] = {}
    for direction in ("down", "up"):
        total = sum(b for d, b in zip(cols["direction"], cols["bytes"]) if d == direction)
        out[f"bytes_{direction}"] = int(total)
        out[f"bytes_{direction}_per_client"] = total / num_clients if num_clients else 0.0
    return out
