"""ray.trim_memory: the allocator's free pages go back to the system after every client call,
and the numbers stay the same."""

import ctypes
import os
import sys

import pytest
import torch
from support.configs import small_config

from raysoft.backends import host as host_module
from raysoft.backends.allocator import release_free_memory
from raysoft.backends.host import ClientHost
from raysoft.config import parse_config

MIB = 1 << 20
glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                           reason="malloc_trim is glibc's")


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


@glibc
def test_freed_heap_pages_below_a_live_block_go_back_to_the_system():
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(64 * 1024) for _ in range(1600)]  # 100 MiB of heap blocks (below the mmap threshold)
    for b in blocks:
        ctypes.memset(b, 1, 64 * 1024)  # touched: resident
    pin = libc.malloc(64 * 1024)  # a live block above them keeps the heap's top from shrinking by itself
    try:
        for b in blocks:
            libc.free(b)
        held = resident_mib()
        assert release_free_memory() is True
        assert held - resident_mib() > 50  # most of the 100 MiB freed is no longer resident
    finally:
        libc.free(pin)


def fedavg_host(trim: bool) -> ClientHost:
    return ClientHost(parse_config(small_config(algorithm={"name": "fedavg"}, ray={"trim_memory": trim})), range(10))


MODEL = {"model": torch.full((10,), 0.1)}


@pytest.mark.parametrize("trim", [True, False])
def test_every_client_call_trims_when_asked(monkeypatch, trim):
    calls = []
    monkeypatch.setattr(host_module, "release_free_memory", lambda: calls.append(1) or True)
    h = fedavg_host(trim)
    h.call("train", [1, 4], MODEL, 0)
    h.call_for_reduction("train", [2], MODEL, 1)
    h.call("evaluate", [0], MODEL, 1)
    assert len(calls) == (3 if trim else 0)


def test_trimming_changes_no_result():
    trimmed, plain = fedavg_host(True), fedavg_host(False)  # the real malloc_trim, after every call
    for t in range(3):
        a, b = trimmed.call("train", [1, 4, 7], MODEL, t), plain.call("train", [1, 4, 7], MODEL, t)
        assert all(torch.equal(a[k], b[k]) for k in (1, 4, 7))
