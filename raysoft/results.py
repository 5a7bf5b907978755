"""The results contract: Parquet tables and summary.json, written atomically.

Tables (one row per measurement; see docs/running.md#what-a-run-writes):

* ``metrics.parquet``: run_id, algorithm, step, time_s, scope, entity, eval_dist, metric, value,
  virtual_time (streams: the virtual clock of the upload; null for synchronous rounds)
* ``weights.parquet``: run_id, step, client, center, estimate
* ``clients.parquet``: run_id, step, client, distribution, share, samples
* ``assignments.parquet`` (hard clusterings: FPFC, IFCA): run_id, client, predicted, truth
* ``placement.parquet`` (Ray backend): run_id, client, actor, node_id
* ``events.parquet`` (checkpoints, faults, recoveries, excluded updates): run_id, step, time_s,
  kind, client, actor, detail
* ``labels.parquet`` (classification data): run_id, client, split, label, count: each client's
  label counts in its train (and test) split
* ``clustering.parquet``: run_id, step, clustering, metric, value: an algorithm's clusterings
  scored against the clients' true clusters at every evaluation (ARI, NMI, mixture error, changes)
* ``client_metrics.parquet``: run_id, step, client, held_out, metric, value: every client's
  personalised model on its own test split (held_out: a client kept out of training, cold-started)
* ``comm.parquet``: run_id, step, client, direction, bytes: what each client received ("down")
  and sent ("up") in each round or upload
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

_TYPES = {"s": pa.string(), "i": pa.int64(), "f": pa.float64(), "b": pa.bool_()}
_COLUMNS = {  # table -> "column:type ..." (s string, i int64, f float64, b bool)
    "metrics": "run_id:s algorithm:s step:i time_s:f scope:s entity:i eval_dist:i metric:s value:f virtual_time:f",
    "weights": "run_id:s step:i client:i center:i estimate:f",
    "clients": "run_id:s step:i client:i distribution:i share:f samples:i",
    "assignments": "run_id:s client:i predicted:i truth:i",
    "events": "run_id:s step:i time_s:f kind:s client:i actor:i detail:s",
    "placement": "run_id:s client:i actor:i node_id:s",
    # CCFL: Algorithm 1's terms of every fresh upload
    "estimation": "run_id:s step:i client:i center:i l:f d1:f d2:f score:f alpha:f rejected:b gap:f alpha2:f",
    # an algorithm's own per-round figures (FedSoft: coupling)
    "diagnostics": "run_id:s step:i name:s value:f",
    # each client's label counts per split ("train", "test"), for classification data
    "labels": "run_id:s client:i split:s label:i count:i",
    # clusterings scored against the truth at every evaluation; clustering: "assignment" (hard) or
    # "weights_argmax" (soft); metric: "ari", "nmi", "changed" (clients that moved), "mixture_mae"
    "clustering": "run_id:s step:i clustering:s metric:s value:f",
    # every client's personalised model on its own test split, at every evaluation
    "client_metrics": "run_id:s step:i client:i held_out:b metric:s value:f",
    # bytes each client received ("down") and sent ("up"), per round or upload
    "comm": "run_id:s step:i client:i direction:s bytes:i",
}
SCHEMAS: dict[str, pa.Schema] = {
    table: pa.schema([(col, _TYPES[kind]) for col, kind in (c.split(":") for c in spec.split())])
    for table, spec in _COLUMNS.items()
}
OPTIONAL = {
    "assignments", "events", "placement", "estimation", "diagnostics", "labels", "clustering", "client_metrics", "comm",
}  # written only when there are rows


class Recorder:
    """Collects result rows (as columns) in the coordinator."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.columns: dict[str, dict[str, list]] = {
            name: {f.name: [] for f in schema} for name, schema in SCHEMAS.items()
        }

    def add(self, table: str, **row: object) -> None:
        cols = self.columns[table]
        row.setdefault("run_id", self.run_id)
        if row.keys() != cols.keys():
            raise KeyError(f"{table} row has keys {sorted(row)}, expected {sorted(cols)}")
        for k, v in row.items():
            cols[k].append(v)

    def tables(self) -> dict[str, pa.Table]:
        return {
            name: pa.table(cols, schema=SCHEMAS[name])
            for name, cols in self.columns.items()
            if name not in OPTIONAL or cols["run_id"]
        }


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (``.NAME.tmp``) for the block to write; renamed onto
    ``path`` when the block ends, removed if it raises, so that ``path`` is either the old file or
    the whole new one, never half of it. raysoft writes every result file through this."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def write_table(path: Path, table: pa.Table) -> None:
    """Write one Parquet file atomically (temporary file, then rename)."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def write_config(run_dir: Path, config: Mapping[str, object]) -> None:
    _atomic_write_bytes(run_dir / "config.yaml", yaml.safe_dump(config, sort_keys=False).encode())


def write_tables(run_dir: Path, tables: dict[str, pa.Table]) -> None:
    for name, table in tables.items():
        write_table(run_dir / f"{name}.parquet", table)


def write_run(run_dir: Path, config: Mapping[str, object], tables: dict[str, pa.Table],
              summary: Mapping[str, object]) -> None:
    """Write a run's config, tables and summary into ``run_dir``."""
    write_config(run_dir, config)
    write_tables(run_dir, tables)
    _atomic_write_bytes(run_dir / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
