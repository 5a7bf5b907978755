"""The digest of a run's results and the pinned digests of every algorithm's small runs, per kind
of CPU (tests/e2e/test_digests.py says how they are pinned)."""

from __future__ import annotations

import functools
import hashlib
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

# table -> the columns whose values are pinned (time and run ids vary between runs)
PINNED = {
    "metrics": ["step", "scope", "entity", "eval_dist", "metric", "value", "virtual_time"],
    "weights": ["step", "client", "center", "estimate"],
    "assignments": ["client", "predicted", "truth"],
    "estimation": ["step", "client", "center", "l", "d1", "d2", "score", "alpha", "rejected"],
}


def digest(run) -> str:
    """sha256 over the pinned columns of every table the run wrote, values at full precision
    (``run``: a RunResult or a run directory)."""
    h = hashlib.sha256()
    run_dir = Path(getattr(run, "run_dir", run))
    for table, cols in PINNED.items():
        path = run_dir / f"{table}.parquet"
        if not path.exists():
            continue
        df = pd.read_parquet(path)[cols]
        for col in cols:
            values = df[col].to_numpy()
            if values.dtype.kind == "f":
                h.update(np.ascontiguousarray(values, dtype=np.float64).tobytes())
            else:
                h.update("\x1f".join(map(repr, values.tolist())).encode())
        h.update(table.encode())
    return h.hexdigest()[:16]


SYNC = {
    "fedsoft": dict(),
    "fedsoft_full": dict(algorithm={"selection": "full"}),
    "ifca": dict(algorithm={"name": "ifca", "clients_per_round": 6}, train={"optimizer": "sgd", "lr": 0.05}),
    "ifca_gradient": dict(algorithm={"name": "ifca", "option": "gradient"}, train={"optimizer": "sgd", "lr": 0.05}),
    "fedem": dict(algorithm={"name": "fedem"}, train={"optimizer": "sgd", "lr": 0.05}),
    "fedavg": dict(algorithm={"name": "fedavg"}),
    "local": dict(algorithm={"name": "local"}),
    "fpfc": dict(algorithm={"name": "fpfc", "rounds": 6, "clients_per_round": 4, "eval_every": 3},
                 data={"name": "fpfc_synthetic", "clients": 8, "distributions": 2},
                 model={"name": "logistic"}, train={"optimizer": "sgd", "lr": 0.1, "batch_size": None}),
    "fpfc_l1": dict(algorithm={"name": "fpfc_l1", "rounds": 6, "clients_per_round": 4, "eval_every": 3,
                               "lam": 0.2, "pairs": "code"},
                    data={"name": "fpfc_synthetic", "clients": 8, "distributions": 2},
                    model={"name": "logistic"}, train={"optimizer": "sgd", "lr": 0.1, "batch_size": None}),
}

STREAMS = {
    "ccfl": dict(),
    "ccfl_shift": dict(upload_policy="shift"),
    "fedsoft_async": dict(name="fedsoft_async"),
    "local_stream": dict(name="local_stream"),
}

# the seven synchronous runs on CNNs and linear models: the same bits on both kinds of CPU below
SAME_ON_BOTH = {
    "fedsoft": "1b8eafeeec175a23",
    "fedsoft_full": "bc97a63743701042",
    "ifca": "841c7a7832a81cb3",
    "ifca_gradient": "773036ef87ed0e3e",
    "fedem": "7517ae4065da8de9",
    "fedavg": "413276a6503300e8",
    "local": "4e215d7899927be4",
}
# (machine, torch's CPU capability, CPU model name or "*" for any) -> case -> digest
EXPECTED_BY_CPU: dict[tuple[str, str, str], dict[str, str]] = {
    # pinned 2026-11-25 on an x86_64 machine whose torch ran its AVX2 kernels
    ("x86_64", "AVX2", "*"): {
        **SAME_ON_BOTH,
        "fpfc": "7be0c472cbd9fec5",
        "fpfc_l1": "45b9dc6bf45d42d7",
        "ccfl": "69c3ef417c53e9d3",
        "ccfl_shift": "60f3800301f59776",
        "fedsoft_async": "4fc573206b23c6b7",
        "local_stream": "923e4a1a23b37285",
    },
    # 2026-11-26, the same commit's numbers on an AMD EPYC with AVX-512
    ("x86_64", "AVX512", "AMD EPYC"): {
        **SAME_ON_BOTH,
        "fpfc": "883f19770b47cb02",
        "fpfc_l1": "c163dc0277e3b151",
        "ccfl": "131e8facaffaba21",
        "ccfl_shift": "a65e6f284f7f0cf5",
        "fedsoft_async": "f2ec0030e3188e9e",
        "local_stream": "a6eff945aefc681a",
    },
}


@functools.cache
def cpu_kind() -> tuple[str, str, str]:
    """(machine, torch's CPU capability, the CPU's model name) of this process."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return platform.machine(), torch.backends.cpu.get_cpu_capability(), model


def pinned(case: str) -> str | None:
    """The pinned digest of ``case`` on this kind of CPU, or None on a kind with none."""
    machine, capability, model = cpu_kind()
    for key in ((machine, capability, model), (machine, capability, "*")):
        if key in EXPECTED_BY_CPU:
            return EXPECTED_BY_CPU[key][case]
    return None


def digest_elsewhere(cfg: dict, scratch: Path) -> str:
    """The digest of ``cfg`` run again in a fresh process (``raysoft run``), under ``scratch``."""
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / "again.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "raysoft", "run", str(path), "--out", str(scratch / "again")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return digest(proc.stdout.strip().splitlines()[-1])


def check_digest(case: str, run, cfg: dict, scratch: Path) -> None:
    """``run`` (of ``cfg``) has the pinned digest of ``case`` on this kind of CPU; on a kind with
    none pinned, the digest of the same config run again in another process: determinism is
    checked on every machine, the pinned digests being an extra check where there are some."""
    got, want = digest(run), pinned(case)
    if want is not None:
        assert got == want, f"{case}: digest {got}, pinned {want} for {cpu_kind()}"
        return
    again = digest_elsewhere(cfg, scratch)
    assert got == again, (f"{case}: no digest pinned for {cpu_kind()}, and two runs of the same config differ "
                          f"({got} here, {again} in another process)")


def expected_or_clean(case: str, clean_run) -> str:
    """The pinned digest of ``case``, or on a kind of CPU with none the digest of ``clean_run()``
    (an uninterrupted run of the same config), for tests whose claim is "the same numbers"."""
    want = pinned(case)
    return want if want is not None else digest(clean_run())
