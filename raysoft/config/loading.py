"""Reading a config: YAML files, ``--set`` overrides (:func:`apply_overrides`) and validation
into a :class:`~raysoft.config.Config`, every refusal a one-line :class:`ConfigError`."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError

from ..errors import ConfigError
from ..plugins import registered, settings_keys
from .experiment import DISPATCHED, Config
from .overrides import apply_overrides
from .regimes import apply_regime
from .section import UNKNOWN_KEY, format_error
from .yamlio import load_yaml


def parse_config(raw: Mapping[str, object] | None) -> Config:
    """Validate a config mapping (after :func:`apply_regime`); raise :class:`ConfigError` with a
    one-line message."""
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ConfigError("config: the top level must be a mapping of sections")
    raw = apply_regime(raw)
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_owners_hint(format_error(err).replace("\n", " "))) from None


_UNKNOWN_KEY = re.compile(rf"^(algorithm|data|model)\.(\w+): {UNKNOWN_KEY}")
KINDS = {section: kind for section, (kind, _) in DISPATCHED.items()}
"""section -> the kind of plug-in its ``name`` names."""


def _owners_hint(line: str) -> str:
    """``line``, and for an unknown key of the algorithm, data or model section that other
    registered algorithms, datasets or models have, which (instead of the nearest key): a config
    holding several algorithms' keys is meant for ``raysoft compare``."""
    found = _UNKNOWN_KEY.match(line)
    if found is None:
        return line
    section, key = found.groups()
    kind = KINDS[section]
    owners = sorted({name for name in registered(kind) if key in settings_keys(kind, name)})
    if not owners:
        return line
    if section == "algorithm":
        return (f"algorithm.{key}: {UNKNOWN_KEY} ({key} is a key of {', '.join(owners)}: a config with several "
                "algorithms' keys is for raysoft compare CONFIG --algorithms ...)")
    return f"{section}.{key}: {UNKNOWN_KEY} ({key} is a key of the {kind} {', '.join(owners)})"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or start from defaults), apply overrides and validate it."""
    return parse_config(load_raw(path, overrides))


RETIRED = {
    "data": ("dim", "classes", "theta_std", "noise_std", "generator", "alpha", "beta", "root", "rotations"),
    "model": ("channels", "hidden", "memory_format"),
}
"""Keys that the ``data`` and ``model`` sections' bases held before each dataset and model owned
its settings: a run's saved config.yaml of then holds them all, whatever its dataset and model."""


def load_saved_config(path: str | Path) -> Config:
    """A run's saved config (its ``config.yaml``, for ``--resume``), written by this version or
    an earlier one: the keys of :data:`RETIRED` that the run's dataset or model does not have
    (which it did not read) are left out."""
    raw = load_raw(path)
    for section, keys in RETIRED.items():
        given = raw.get(section)
        name = given.get("name", DISPATCHED[section][1]) if isinstance(given, Mapping) else None
        if not isinstance(given, Mapping) or not isinstance(name, str):
            continue
        own = settings_keys(KINDS[section], name)
        if own:
            raw[section] = {k: v for k, v in given.items() if k in own or k not in keys}
    return parse_config(raw)


def _shipped_copy(p: Path) -> Path:
    """A ``jobs/...`` or ``examples/...`` path missing from the current folder: the copy that ships
    with raysoft (one line on stderr says so), else ConfigError."""
    from ..shipped import shipped_config

    found = shipped_config(p)
    if found is None:
        raise ConfigError(f"config file {str(p)!r} not found")
    sys.stderr.write(f"raysoft: {p} is not in this folder: reading the one shipped with raysoft "
                     f"(raysoft example jobs writes them here)\n")
    return found


def load_raw(path: str | Path | None = None, overrides: list[str] | None = None) -> dict[str, object]:
    """Read a YAML config and apply overrides, without validating it."""
    raw: Mapping[str, object] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            p = _shipped_copy(p)
        try:
            loaded = load_yaml(p.read_text()) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ConfigError(f"config file {str(p)!r}: invalid YAML{where}") from None
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"config file {str(p)!r}: the top level must be a mapping of sections")
        raw = loaded
    return apply_overrides(raw, list(overrides or []))
