"""Reading a config: YAML files, ``--set`` overrides (:func:`apply_overrides`) and validation
into a :class:`~raysoft.config.Config`, every refusal a one-line :class:`ConfigError`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..errors import ConfigError
from ..plugins import registered, settings_class
from .experiment import Config
from .overrides import apply_overrides
from .regimes import apply_regime
from .section import UNKNOWN_KEY, format_error
from .yamlio import load_yaml


def parse_config(raw: Mapping[str, Any] | None) -> Config:
    """Validate a config mapping (after :func:`apply_regime`); raise :class:`ConfigError` with a
    one-line message."""
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ConfigError("config: the top level must be a mapping of sections")
    raw = apply_regime(raw)
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_other_algorithms_hint(format_error(err).replace("\n", " "))) from None


def _algorithm_keys(name: str) -> set[str]:
    try:
        return set(settings_class("algorithms", name).model_fields)
    except (ConfigError, ValueError):  # a plug-in that cannot be read says so when it is named
        return set()


_UNKNOWN_ALGORITHM_KEY = re.compile(rf"^algorithm\.(\w+): {UNKNOWN_KEY}")


def _other_algorithms_hint(line: str) -> str:
    """``line``, and for an unknown key of the algorithm section that other built-in algorithms
    have, which (instead of the nearest key), since a config holding several algorithms' keys is
    meant for ``raysoft compare``."""
    found = _UNKNOWN_ALGORITHM_KEY.match(line)
    if found is None:
        return line
    key = found.group(1)
    owners = [name for name in sorted(registered("algorithms")) if key in _algorithm_keys(name)]
    if not owners:
        return line
    return (f"algorithm.{key}: {UNKNOWN_KEY} ({key} is a key of {', '.join(owners)}: a config with several "
            "algorithms' keys is for raysoft compare CONFIG --algorithms ...)")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config (or start from defaults), apply overrides and validate it."""
    return parse_config(load_raw(path, overrides))


def load_raw(path: str | Path | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Read a YAML config and apply overrides, without validating it."""
    raw: Any = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} not found")
        try:
            raw = load_yaml(p.read_text()) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ConfigError(f"config file {str(p)!r}: invalid YAML{where}") from None
        if not isinstance(raw, Mapping):
            raise ConfigError(f"config file {str(p)!r}: the top level must be a mapping of sections")
    return apply_overrides(raw, list(overrides or []))
