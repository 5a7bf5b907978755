"""The ``output`` section: where a run writes, under which name, and how it shows progress."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from .section import Section


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be one component of a path inside the output folder, or None."""
    if "/" in name or "\\" in name or "\0" in name:
        return f"must be one file name, not a path (got {name!r})"
    if name in (".", ".."):
        return f"must name a folder inside output.dir (got {name!r})"
    if name.startswith("."):
        return f"must not start with '.' (hidden names are the unfinished runs') (got {name!r})"
    return None


class OutputConfig(Section):
    dir: str = "runs"
    name: str | None = Field(
        None, description="run name prefix: one file name (no separators, not hidden); default <algorithm>-<data>"
    )
    progress: Literal["auto", "bar", "lines", "none"] = "auto"
    checkpoint_every: int = Field(
        0, ge=0, description="save a checkpoint (and the results so far) every this many rounds; 0: never"
    )
    target: float | None = Field(
        None, description="a target of the personalised headline metric (accuracy, or mse for regression): the "
        "summary's time_to_target says the first evaluation (round or upload, virtual second) at which the clients' "
        "mean and their worse tenth reach it; none: not reported"
    )

    @field_validator("name")
    @classmethod
    def _one_component(cls, v: str | None) -> str | None:
        why = name_problem(v) if v else None  # empty: the default
        if why is not None:
            raise ValueError(why)
        return v
