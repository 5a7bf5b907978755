"""Walking the nested payloads and results that cross between the coordinator and the clients.

One definition of a container for every walker in raysoft (the NaN check of a result, the fault
injector's poison, the byte count of a payload, moving tensors to a device): dicts (their
values), lists, tuples (named tuples kept as they are) and dataclass instances (their fields).
Anything else is a leaf. torch has a pytree module, but it is private (``torch.utils._pytree``)
and does not descend into dataclasses, which the algorithms' results are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any


def _is_dataclass_instance(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def leaves(obj: Any) -> Iterator[Any]:
    """Every leaf of ``obj``, depth first, in the containers' own order."""
    if isinstance(obj, dict):
        for value in obj.values():
            yield from leaves(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from leaves(value)
    elif _is_dataclass_instance(obj):
        for field in dataclasses.fields(obj):
            yield from leaves(getattr(obj, field.name))
    else:
        yield obj


def map_leaves(fn: Callable[[Any], Any], obj: Any) -> Any:
    """``obj`` with every leaf replaced by ``fn(leaf)``: the same containers, rebuilt (a
    dataclass through ``dataclasses.replace`` of its init fields)."""
    if isinstance(obj, dict):
        return type(obj)((k, map_leaves(fn, v)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(map_leaves(fn, v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_leaves(fn, v) for v in obj)
    if _is_dataclass_instance(obj):
        return dataclasses.replace(obj, **{f.name: map_leaves(fn, getattr(obj, f.name))
                                           for f in dataclasses.fields(obj) if f.init})
    return fn(obj)
