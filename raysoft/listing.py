"""``raysoft list [KIND] [NAME ...]``: the algorithms, models, datasets and callbacks a config can
name (built in, registered by installed packages, or given by import path), each with every
setting of its schema: its type, default, bounds and description."""

from __future__ import annotations

import inspect
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from .plugins import GROUPS, is_import_path, registered, settings_class, target


def _type_text(annotation: object) -> str:
    text = getattr(annotation, "__name__", None) if not typing.get_args(annotation) else None
    return text or str(annotation).replace("typing.", "")


def _default_text(field: Any) -> str:  # FieldInfo: its default_factory may take the data
    if field.default_factory is not None:
        return repr(field.default_factory())
    return "required" if field.is_required() else repr(field.default)


BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def _bounds_text(field: FieldInfo) -> str:
    """`` (>= 1)``, `` (> 0, <= 1)``: the bounds of the field's ``Field(ge=..., ...)``, or ``""``."""
    found = [f"{sign} {getattr(m, attr)!r}" for attr, sign in BOUNDS for m in field.metadata
             if getattr(m, attr, None) is not None]
    return f" ({', '.join(found)})" if found else ""


def setting_lines(settings: type[BaseModel]) -> list[str]:
    """One line per setting of a settings class (``name`` left out): key, type, default, its
    bounds, and the description where it has one."""
    lines = []
    for key, field in settings.model_fields.items():
        if key == "name":
            continue
        line = f"    {key}: {_type_text(field.annotation)} = {_default_text(field)}{_bounds_text(field)}"
        if field.description:
            line += f"  # {' '.join(field.description.split())}"
        lines.append(line)
    return lines


def _summary(obj: object) -> str:
    """The first paragraph of the plug-in's own docstring, else of its module's."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    if not doc:
        doc = getattr(inspect.getmodule(obj), "__doc__", None) or ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def describe(kind: str, name: str, source: str) -> list[str]:
    """The lines that describe one plug-in."""
    settings = settings_class(kind, name)  # checks a plug-in's code (a declaration's is imported where it runs)
    obj = target(kind, name)
    head = f"  {name}  [{source}]"
    summary = _summary(obj)
    lines = [head] + ([f"    {summary}"] if summary else [])
    own = setting_lines(settings)
    return lines + (own if own else ["    (no settings)"]) + scenario_lines(settings)


def scenario_lines(settings: type[BaseModel]) -> list[str]:
    """The named scenarios a dataset's settings declare (``SCENARIOS``: name, its settings, what
    it is, its job file), one line each, or nothing."""
    rows = getattr(settings, "SCENARIOS", ())
    if not rows:
        return []
    return ["    scenarios:"] + [f"      {name}: {keys}  # {what} ({job})" for name, keys, what, job in rows]


def listing(kinds: list[str], names: list[str]) -> str:
    """The text ``raysoft list`` prints."""
    out: list[str] = []
    for kind in kinds:
        table = registered(kind)
        chosen = names or sorted(table)
        out.append(f"{kind} ({GROUPS[kind]}):")
        for name in chosen:
            if is_import_path(name):
                source = "import path"
            elif name in table:
                source = "built in" if table[name].dist == "raysoft" else f"from {table[name].dist}"
            else:
                source = "?"
            out += describe(kind, name, source)
        out.append("")
    return "\n".join(out)


def main(kind: str | None, names: list[str]) -> int:
    if kind is None:
        if names:
            from .errors import ConfigError

            raise ConfigError("list: name a kind (algorithms, models, datasets, callbacks) before the names")
        kinds = list(GROUPS)
    else:
        kinds = [kind]
    print(listing(kinds, names), end="")
    return 0


__all__ = ["describe", "listing", "main", "scenario_lines", "setting_lines"]
