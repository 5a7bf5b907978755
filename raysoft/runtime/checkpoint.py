"""Checkpoints: everything a coordinator needs to continue a run, written atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..results import Recorder, write_tables

CHECKPOINT = "checkpoint.pt"


def save_checkpoint(run_dir: Path, blob: dict[str, Any], recorder: Recorder) -> None:
    """Write a checkpoint atomically (temporary file, then rename), then the results so far."""
    tmp = run_dir / f".{CHECKPOINT}.tmp"
    torch.save(blob, tmp)
    os.replace(tmp, run_dir / CHECKPOINT)
    write_tables(run_dir, recorder.tables())


def load_checkpoint(run_dir: Path | None) -> dict[str, Any] | None:
    """The checkpoint in ``run_dir``, or None if there is none."""
    path = run_dir / CHECKPOINT if run_dir else None
    if path is None or not path.exists():
        return None
    return torch.load(path, weights_only=False)
