"""``regimes``: the sections each algorithm of a comparison runs with (its own reference code's
optimiser, say), merged into a config's sections for that algorithm."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError
from ..plugins import settings_class
from .experiment import DISPATCHED
from .section import Section

REGIME_SECTIONS = ("algorithm", "train", "model")
COMPARE_DEFAULT = ("fedsoft", "ifca", "fedem", "fedavg", "local")  # raysoft compare's algorithms by default


def apply_regime(raw: Mapping[str, object]) -> dict[str, object]:
    """``raw`` without its ``regimes`` key, and with the regime of its own algorithm merged into
    its sections. ``regimes`` maps an algorithm name to the ``algorithm``, ``train`` and ``model``
    keys that algorithm runs with (its own reference code's optimiser, say), so that one job file
    runs every method of a comparison in its own regime on the same data; a regime's keys win over
    the sections' (and over ``--set``). The resolved config records the merged sections only."""
    out = dict(raw)
    regimes = out.pop("regimes", None)
    if regimes is None:
        return out
    if not isinstance(regimes, Mapping):
        raise ConfigError("regimes: must be a mapping of algorithm name -> sections")
    for name, regime in regimes.items():
        try:
            settings_class("algorithms", name)
        except ConfigError as err:
            raise ConfigError(f"regimes.{name}: {err}") from None
        if not isinstance(regime, Mapping):
            raise ConfigError(f"regimes.{name}: must be a mapping of sections")
        for section, keys in regime.items():
            if section not in REGIME_SECTIONS:
                raise ConfigError(f"regimes.{name}.{section}: a regime sets only {', '.join(REGIME_SECTIONS)} keys "
                                  "(the data, seed and resources stay the comparison's)")
            if not isinstance(keys, Mapping) or "name" in keys:
                raise ConfigError(f"regimes.{name}.{section}: must be a mapping of keys (without 'name')")
    algo = out.get("algorithm", {})
    name = (
        getattr(algo, "name", None) if isinstance(algo, Section)
        else algo.get("name", DISPATCHED["algorithm"][1]) if isinstance(algo, Mapping) else None
    )
    for section, keys in (regimes.get(name) or {}).items():
        current = out.get(section, {})
        if isinstance(current, Section):
            current = current.model_dump()
        if not isinstance(current, Mapping):
            raise ConfigError(f"{section}: must be a mapping")
        out[section] = {**current, **keys}
    return out
