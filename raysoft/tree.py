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
from typing import TYPE_CHECKING, TypeVar, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from typing_extensions import TypeIs


T = TypeVar("T")


def _is_dataclass_instance(obj: object) -> TypeIs[DataclassInstance]:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def leaves(obj: object) -> Iterator[object]:
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


def map_leaves(fn: Callable[[object], object], obj: T) -> T:
    """``obj`` with every leaf replaced by ``fn(leaf)``: the same containers, rebuilt (a
    dataclass through ``dataclasses.replace`` of its init fields) only where a leaf below them
    changed; a container whose leaves ``fn`` returns as they are is returned itself, not copied
    (moving a CPU payload to the CPU copies nothing)."""
    if isinstance(obj, dict):
        items = [(k, map_leaves(fn, v)) for k, v in obj.items()]
        same = all(new is old for (_, new), old in zip(items, obj.values()))
        return obj if same else type(obj)(items)
    if isinstance(obj, (list, tuple)):
        values = [map_leaves(fn, v) for v in obj]
        if all(new is old for new, old in zip(values, obj)):
            return obj
        return type(obj)(*values) if hasattr(obj, "_fields") else type(obj)(values)  # a named tuple: *values
    if _is_dataclass_instance(obj):
        changes = {f.name: map_leaves(fn, getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
        same = all(new is getattr(obj, name) for name, new in changes.items())
        return obj if same else dataclasses.replace(obj, **changes)
    return cast(T, fn(obj))  # fn keeps a leaf's kind (a tensor on a device, NaN-filled)
