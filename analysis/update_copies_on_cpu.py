"""What a GPU host would spend on its CPU each W2 round if every client's update came back to the
CPU to be summed there (docs/performance.md#on-a-gpu): 60 copies of W2's CNN (1,663,370
parameters, 6.65 MB) into new CPU memory, their n_k-weighted sum, and the finiteness check of
each, on one thread, three times.

    .venv/bin/python analysis/update_copies_on_cpu.py
"""

from __future__ import annotations

import time

import torch

PARAMS = 1_663_370  # W2's CNN: conv 32/64, FC 512
CLIENTS = 60  # W2's clients a round


def main() -> None:
    torch.set_num_threads(1)
    parts = [torch.randn(PARAMS) for _ in range(CLIENTS)]
    for _ in range(3):
        began = time.perf_counter()
        copies = [p.clone() for p in parts]
        copied = time.perf_counter() - began
        del copies
        acc = torch.zeros(PARAMS)
        began = time.perf_counter()
        for p in parts:
            acc.add_(p, alpha=1 / CLIENTS)
        added = time.perf_counter() - began
        began = time.perf_counter()
        checked = [bool(torch.isfinite(p.sum())) for p in parts]
        finite = time.perf_counter() - began
        print(f"{CLIENTS} copies into new memory {copied:.3f} s, {CLIENTS} adds {added:.3f} s, "
              f"{len(checked)} finiteness checks {finite:.3f} s")


if __name__ == "__main__":
    main()
