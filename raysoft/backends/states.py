"""Where a host keeps its clients' persistent states between their calls.

``ray.client_state: memory`` keeps every state resident on the host's device (the fastest; a
FedSoft client with the 28x28 CNN and Adam costs about 20 MB, so 1,000 clients need about 20 GB).
``host`` keeps them resident in the host process's own (CPU) memory and moves a state to the
host's device only while a call uses it: on a GPU, the states of more clients than the GPU's
memory holds (on the CPU it is ``memory``). ``disk`` keeps each
state as a file in a private scratch directory on the host's own node (``ray.state_dir``, else
the system's temporary folder) and materialises it only while a call uses it: a host then holds
one client's state at a time (all of a call's clients for batched training), whatever the
population. A client that was never called has no file yet: its initial state is built from
(seed, client id) when it is first used, exactly as it would have been at start-up. Files are
written with ``torch.save`` and read back with ``weights_only=True`` and the checkpoints' allow-
list, so a state comes back bit for bit; the directory is removed with the host. Its name
carries the node's name and the host process's id (``raysoft-states-NODE-PID-...``): a host
killed before it could remove it (SIGKILL, the memory monitor) leaves it behind, and the next
store made in the same folder on the same node removes every such folder whose process is gone.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import weakref
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import torch

from ..devices import state_to_device
from ..results import atomic_path

PREFIX = "raysoft-states-"


def _prefix() -> str:
    return f"{PREFIX}{socket.gethostname()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_orphans(folder: Path) -> list[Path]:
    """Remove the state folders in ``folder`` that this node's dead processes left (a folder of
    another node, or of a live process, is kept); returns those removed."""
    removed = []
    for p in folder.glob(f"{_prefix()}*-*"):
        pid = p.name[len(_prefix()):].split("-", 1)[0]
        if p.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


class StateStore(MutableMapping):
    """Client id -> state, resident (``memory``), resident in CPU memory and moved to ``device``
    while used (``host``), or spilled to files (``disk``); ``make(k)`` builds client k's initial
    state on first use."""

    def __init__(self, mode: str, make: Callable[[int], Any], ids: list[int], directory: str | None = None,
                 device: torch.device | None = None) -> None:
        self.mode = mode
        self._make = make
        self._ids = set(ids)
        self._mem: dict[int, Any] = {}
        self._dir: Path | None = None
        # where a state is kept (None: as it is) and where a call gets it
        self._keep = torch.device("cpu") if mode == "host" else None
        self._use = device or torch.device("cpu")
        if mode in ("memory", "host"):
            for k in ids:
                self[k] = make(k)
        else:
            if directory is not None:
                Path(directory).mkdir(parents=True, exist_ok=True)
            remove_orphans(Path(directory or tempfile.gettempdir()))
            self._dir = Path(tempfile.mkdtemp(prefix=f"{_prefix()}{os.getpid()}-", dir=directory))
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._dir), True)

    def _path(self, k: int) -> Path:
        assert self._dir is not None
        return self._dir / f"{k}.pt"

    def __getitem__(self, k: int) -> Any:
        if k not in self._ids:
            raise KeyError(k)
        if self._dir is None:
            return self._mem[k] if self._keep is None else state_to_device(self._mem[k], self._use)
        path = self._path(k)
        if not path.exists():
            return self._make(k)
        from ..runtime.checkpoint import checkpoint_types

        with torch.serialization.safe_globals(checkpoint_types()):
            return torch.load(path, weights_only=True)

    def __setitem__(self, k: int, state: Any) -> None:
        self._ids.add(k)
        if self._dir is None:
            self._mem[k] = state if self._keep is None else state_to_device(state, self._keep)
            return
        path = self._path(k)
        with atomic_path(path) as tmp:
            torch.save(state, tmp)

    def __delitem__(self, k: int) -> None:
        self._ids.discard(k)
        self._mem.pop(k, None)
        if self._dir is not None:
            self._path(k).unlink(missing_ok=True)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._ids))

    def __len__(self) -> int:
        return len(self._ids)

    def disk_bytes(self) -> int:
        """Bytes of the spilled states' files (0 in memory)."""
        if self._dir is None:
            return 0
        return sum(p.stat().st_size for p in self._dir.glob("*.pt"))
