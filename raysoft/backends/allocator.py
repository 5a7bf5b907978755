"""Handing the C allocator's free memory back to the system (``ray.trim_memory``).

glibc's allocator keeps the memory a process freed for its next allocations; in a client actor
that trains and scores one client after another, the freed holes between live blocks stay
resident and the actor's footprint creeps up over a long run (docs/performance.md#where-w3s-memory-grows).
``malloc_trim(0)`` returns those pages to the system; it moves no live block, so no number changes.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    """The C library's ``malloc_trim``, or None where it has none (not glibc)."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_free_memory() -> bool:
    """Hand the allocator's free pages back to the system; False where the C library cannot."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
