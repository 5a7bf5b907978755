"""Whether two runs are the same run: their results tables without what differs between equal
runs (the run id and the wall clock), compared exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

VARYING = ("run_id", "time_s")  # differ between equal runs


def values(run: Any, table: str = "metrics") -> pd.DataFrame:
    """``table`` of ``run`` (a RunResult or a run directory) without its varying columns."""
    run_dir = Path(getattr(run, "run_dir", run))
    df = pd.read_parquet(run_dir / f"{table}.parquet")
    return df.drop(columns=[c for c in VARYING if c in df.columns]).reset_index(drop=True)


def assert_same(a: Any, b: Any, tables: tuple[str, ...] = ("metrics", "weights")) -> None:
    """``a`` and ``b`` wrote the same ``tables``, value for value."""
    for table in tables:
        pd.testing.assert_frame_equal(values(a, table), values(b, table), check_exact=True)
