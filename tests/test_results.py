"""raysoft.results: the Recorder's rows and the Parquet/summary files of the results contract
(columns and dtypes as documented, empty tables, atomic replacement)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from raysoft.results import OPTIONAL, SCHEMAS, Recorder, write_run, write_table, write_tables

# The module docstring's contract, written out again: a renamed or retyped column fails here.
CONTRACT = {
    "metrics": {"run_id": pa.string(), "algorithm": pa.string(), "step": pa.int64(), "time_s": pa.float64(),
                "scope": pa.string(), "entity": pa.int64(), "eval_dist": pa.int64(), "metric": pa.string(),
                "value": pa.float64(), "virtual_time": pa.float64()},
    "weights": {"run_id": pa.string(), "step": pa.int64(), "client": pa.int64(), "center": pa.int64(),
                "estimate": pa.float64()},
    "clients": {"run_id": pa.string(), "step": pa.int64(), "client": pa.int64(), "distribution": pa.int64(),
                "share": pa.float64(), "samples": pa.int64()},
    "assignments": {"run_id": pa.string(), "client": pa.int64(), "predicted": pa.int64(), "truth": pa.int64()},
    "placement": {"run_id": pa.string(), "client": pa.int64(), "actor": pa.int64(), "node_id": pa.string()},
    "events": {"run_id": pa.string(), "step": pa.int64(), "time_s": pa.float64(), "kind": pa.string(),
               "client": pa.int64(), "actor": pa.int64(), "detail": pa.string()},
}


def _metric(rec, step=1, value=0.5, virtual_time=None, **kw):
    row = dict(algorithm="fedsoft", step=step, time_s=0.25, scope="cluster", entity=0, eval_dist=1,
               metric="mse", value=value, virtual_time=virtual_time)
    row.update(kw)
    rec.add("metrics", **row)


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_schemas_are_the_documented_columns_and_types(name):
    schema = SCHEMAS[name]
    assert dict(zip(schema.names, schema.types)) == CONTRACT[name]
    assert schema.names == list(CONTRACT[name])  # in the documented order


def test_optional_tables():
    assert {"assignments", "events", "placement"} <= OPTIONAL
    assert not {"metrics", "weights", "clients"} & OPTIONAL


def test_recorder_fills_run_id_and_keeps_row_order():
    rec = Recorder("r1")
    _metric(rec, step=1, value=0.5)
    _metric(rec, step=2, value=0.25, virtual_time=3.5)
    t = rec.tables()["metrics"]
    assert t.schema == SCHEMAS["metrics"]
    assert t.column("run_id").to_pylist() == ["r1", "r1"]
    assert t.column("step").to_pylist() == [1, 2]
    assert t.column("value").to_pylist() == [0.5, 0.25]
    assert t.column("virtual_time").to_pylist() == [None, 3.5]  # null for synchronous rounds


def test_recorder_keeps_an_explicit_run_id():
    rec = Recorder("r1")
    rec.add("weights", run_id="other", step=0, client=3, center=1, estimate=0.75)
    assert rec.tables()["weights"].column("run_id").to_pylist() == ["other"]


def test_recorder_rejects_missing_and_extra_keys():
    rec = Recorder("r1")
    with pytest.raises(KeyError, match="weights row has keys"):
        rec.add("weights", step=0, client=3, center=1)  # no estimate
    with pytest.raises(KeyError):
        rec.add("weights", step=0, client=3, center=1, estimate=0.5, extra=1)
    with pytest.raises(KeyError):
        rec.add("no_such_table", step=0)
    assert rec.tables()["weights"].num_rows == 0  # nothing half-added


def test_recorder_ints_become_int64_and_floats_float64():
    rec = Recorder("r1")
    rec.add("clients", step=2, client=7, distribution=1, share=1, samples=40)  # share given as an int
    t = rec.tables()["clients"]
    assert t.schema.field("share").type == pa.float64() and t.column("share").to_pylist() == [1.0]
    assert t.schema.field("samples").type == pa.int64()


def test_empty_recorder_has_the_required_tables_only():
    tables = Recorder("r1").tables()
    assert set(tables) == set(SCHEMAS) - OPTIONAL
    for name, t in tables.items():
        assert t.num_rows == 0 and t.schema == SCHEMAS[name]


def test_an_optional_table_appears_with_its_first_row():
    rec = Recorder("r1")
    rec.add("events", step=3, time_s=1.5, kind="fault", client=None, actor=2, detail="killed")
    tables = rec.tables()
    assert "events" in tables and "placement" not in tables
    assert tables["events"].to_pylist() == [
        {"run_id": "r1", "step": 3, "time_s": 1.5, "kind": "fault", "client": None, "actor": 2, "detail": "killed"}
    ]


def test_write_tables_round_trip_including_empty_tables(tmp_path):
    rec = Recorder("r1")
    _metric(rec, step=4, value=1.25)
    tables = rec.tables()
    write_tables(tmp_path, tables)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.parquet" for n in tables)
    for name, t in tables.items():
        back = pq.read_table(tmp_path / f"{name}.parquet")
        assert back.schema.names == SCHEMAS[name].names
        assert back.schema.types == SCHEMAS[name].types
        assert back.equals(t)
    empty = pq.read_table(tmp_path / "weights.parquet")
    assert empty.num_rows == 0 and empty.column_names == SCHEMAS["weights"].names
    assert empty.to_pandas().dtypes["estimate"] == "float64"


def test_write_table_replaces_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "weights.parquet"
    rec = Recorder("a")
    rec.add("weights", step=0, client=0, center=0, estimate=1.0)
    write_table(path, rec.tables()["weights"])
    write_table(path, Recorder("b").tables()["weights"])
    assert pq.read_table(path).num_rows == 0
    assert [p.name for p in tmp_path.iterdir()] == ["weights.parquet"]


def test_a_failed_write_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    """Atomic: the table is written to a temporary file and renamed, so a write that dies half-way
    leaves the old file as it was."""
    path = tmp_path / "metrics.parquet"
    rec = Recorder("old")
    _metric(rec)
    write_table(path, rec.tables()["metrics"])
    before = path.read_bytes()

    def dies_half_way(table, where, *a, **kw):
        with open(where, "wb") as fh:
            fh.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", dies_half_way)  # what results.py writes with
    with pytest.raises(OSError, match="disk full"):
        write_table(path, Recorder("new").tables()["metrics"])
    assert path.read_bytes() == before


def test_write_run_writes_config_tables_and_summary(tmp_path):
    config = {"seed": 3, "algorithm": {"name": "fedsoft", "rounds": 2}, "data": {"name": "synthetic"}}
    summary = {"rounds": 2, "final": {"mse": 0.125}}
    write_run(tmp_path, config, Recorder("r").tables(), summary)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["clients.parquet", "config.yaml", "metrics.parquet", "summary.json", "weights.parquet"]
    text = (tmp_path / "config.yaml").read_text()
    assert yaml.safe_load(text) == config
    assert text.index("seed") < text.index("algorithm") < text.index("data")  # the config's own order
    raw = (tmp_path / "summary.json").read_text()
    assert json.loads(raw) == summary and raw.endswith("}\n")
