"""``--set`` overrides: ``path.to.key=value`` (the value parsed as YAML) applied to a raw config
mapping, at any depth (``regimes.fedsoft.train.lr=1e-3``). Python users call
:func:`apply_overrides` (or pass ``overrides`` to :func:`raysoft.config.load_config`) with the
same strings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from ..errors import ConfigError
from .experiment import Config
from .section import nearest
from .yamlio import load_yaml


def _parse(text: str) -> Any:
    return load_yaml(text) if text else ""  # 1e-3 a number, as in a config file


def _copy(value: Any) -> Any:
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, Mapping) else value


def apply_overrides(raw: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``raw`` with each ``path.to.key=value`` of ``overrides`` applied, in order; ``raw`` itself
    is not changed. The first component names a section (or ``regimes``); a missing mapping on the
    way is created, a value on the way that is not a mapping is refused."""
    out: dict[str, Any] = _copy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.split(".")
        if not sep or not key or "" in parts:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        try:
            value = _parse(text)
        except yaml.YAMLError:
            raise ConfigError(f"--set {key}: cannot parse value {text!r}") from None
        if parts[0] not in (*Config.SECTIONS, "regimes"):
            known = [*Config.SECTIONS, "regimes"]
            raise ConfigError(f"{parts[0]}: unknown section{nearest(parts[0], known)} (known: {', '.join(known)})")
        node = out
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{'.'.join(parts[:depth + 1])}: must be a mapping to set {key}")
            node = child
        node[parts[-1]] = value
    return out
