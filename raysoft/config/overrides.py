"""``--set`` overrides: ``path.to.key=value`` (the value parsed as YAML) applied to a raw config
mapping, at any depth (``regimes.fedsoft.train.lr=1e-3``). Python users call
:func:`apply_overrides` (or pass ``overrides`` to :func:`raysoft.config.load_config`) with the
same strings."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

import yaml

from ..errors import ConfigError
from ..plugins import settings_keys
from .experiment import DISPATCHED, Config
from .section import nearest
from .yamlio import load_yaml


def _parse(text: str) -> object:
    return load_yaml(text) if text else ""  # 1e-3 a number, as in a config file


def _copy(value: object) -> object:
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, Mapping) else value


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _switch(section: dict[str, object], kind: str, old: object, new: object) -> list[str]:
    """Leave out of ``section`` (a dispatched section whose ``name`` changes from ``old`` to
    ``new``) the keys that ``new``'s settings do not have; the keys left out. Nothing is left
    out when ``new`` cannot be read: validation names it."""
    if not isinstance(new, str) or new == old:
        return []
    fields = settings_keys(kind, new)
    if not fields:
        return []
    dropped = [k for k in section if k != "name" and k not in fields]
    for k in dropped:
        del section[k]
    return dropped


def apply_overrides(raw: Mapping[str, object], overrides: list[str],
                    note: Callable[[str], None] | None = None) -> dict[str, object]:
    """``raw`` with each ``path.to.key=value`` of ``overrides`` applied, in order; ``raw`` itself
    is not changed. The first component names a section (or ``regimes``); a missing mapping on the
    way is created, a value on the way that is not a mapping is refused. A new ``name`` of the
    ``algorithm``, ``data`` or ``model`` section (``algorithm.name=fedavg``) leaves out the keys of
    the section that the newly named plug-in does not have, each such change told to ``note`` in
    one line (stderr when ``note`` is None)."""
    note = note or _say
    out: dict[str, object] = {k: _copy(v) for k, v in raw.items()}  # _copy(raw), as a dict
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
        if len(parts) == 2 and parts[0] in DISPATCHED and parts[1] == "name":
            kind, default = DISPATCHED[parts[0]]
            old = node.get("name", default)
            dropped = _switch(node, kind, old, value)
            if dropped:
                note(f"{key}={text}: dropped {old}'s keys {', '.join(dropped)}")
        node[parts[-1]] = value
    return out
