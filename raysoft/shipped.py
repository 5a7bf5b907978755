"""The jobs and examples that ship with raysoft, and ``raysoft example [NAME]``, which writes them out.

A wheel carries the checkout's ``jobs/`` and ``examples/`` as ``raysoft/_shipped/`` (setup.py
copies them when the package is built); an editable install or a checkout finds them beside the
package. A config path the user was told to run (``jobs/fedsoft_synthetic.yaml``) that is not in
the current folder is read from there (:func:`shipped_config`), so a documented job runs from an
empty folder; an example (a plug-in beside its ``job.yaml``) runs from its own folder, which
``raysoft example NAME`` writes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .errors import ConfigError

KINDS = ("jobs", "examples")


def shipped_root() -> Path | None:
    """The folder holding ``jobs/`` and ``examples/``: the wheel's ``raysoft/_shipped``, else the
    checkout the package sits in; None if neither is there."""
    here = Path(__file__).resolve().parent
    if (here / "_shipped").is_dir():
        return here / "_shipped"
    checkout = here.parent
    if (checkout / "jobs").is_dir() and (checkout / "pyproject.toml").is_file():
        return checkout
    return None


def shipped_config(path: Path) -> Path | None:
    """The shipped copy of a relative ``jobs/...`` or ``examples/...`` config path, if there is one."""
    root = shipped_root()
    if root is None or path.is_absolute() or not path.parts or path.parts[0] not in KINDS:
        return None
    candidate = root / path
    return candidate if candidate.is_file() else None


def examples() -> dict[str, str]:
    """The shipped examples: name -> the first line of its README (what it is)."""
    root = shipped_root()
    found: dict[str, str] = {}
    if root is None or not (root / "examples").is_dir():
        return found
    for d in sorted((root / "examples").iterdir()):
        readme = d / "README.md"
        if d.is_dir() and (d / "job.yaml").is_file():
            head = readme.read_text().splitlines()[0].lstrip("# ").strip() if readme.is_file() else ""
            found[d.name] = head
    return found


def jobs() -> list[str]:
    """The shipped job configs (``jobs/*.yaml``)."""
    root = shipped_root()
    return sorted(p.name for p in (root / "jobs").glob("*.yaml")) if root is not None else []


def listing() -> str:
    """What ``raysoft example`` prints without a name."""
    lines = ["jobs: the experiment configs the docs run (raysoft run jobs/NAME.yaml works from any folder;",
             "      raysoft example jobs writes them into ./jobs)"]
    lines += [f"  jobs/{name}" for name in jobs()]
    lines += ["", "examples: plug-ins beside their job.yaml (raysoft example NAME writes ./NAME; then "
                  "cd NAME && raysoft run job.yaml)"]
    lines += [f"  {name:<14} {head}" for name, head in examples().items()]
    return "\n".join(lines) + "\n"


def write_out(name: str, out: str | Path | None = None) -> Path:
    """Copy ``jobs`` (the job configs) or example ``name`` into ``out`` (default ``./NAME``);
    refused if it exists."""
    root = shipped_root()
    if root is None:
        raise ConfigError("example: this raysoft was installed without its jobs and examples")
    known = examples()
    if name != "jobs" and name not in known:
        from .plugins import did_you_mean

        raise ConfigError(f"example: no example {name!r}{did_you_mean(name, ['jobs', *known])}; "
                          f"choose jobs or one of {', '.join(known)}")
    source = root / "jobs" if name == "jobs" else root / "examples" / name
    target = Path(out) if out is not None else Path(name)
    if target.exists():
        raise ConfigError(f"example: {str(target)!r} already exists")
    if name == "jobs":
        target.mkdir(parents=True)
        for p in source.glob("*.yaml"):
            shutil.copy2(p, target / p.name)
    else:
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "runs"))
    return target


__all__ = ["examples", "jobs", "listing", "shipped_config", "shipped_root", "write_out"]
