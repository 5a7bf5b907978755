"""The base of every config section, and how a section's validation error becomes one line.

A validator that knows which key inside its section is wrong marks its message with
:func:`at`; :func:`format_error` turns pydantic's error into ``section.key: message``.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ..plugins import Plugin, lookup
from .yamlio import BOOL_WORDS

UNKNOWN_KEY = "unknown key"

_YAML_WORDS = {True: ("on", "yes", "true"), False: ("off", "no", "false")}
"""The words YAML 1.1 reads as booleans, for each boolean (``off`` -> False)."""


def _literal_words(annotation: object) -> set[str] | None:
    """The string values a field's ``Literal[...]`` (or ``Literal[...] | None``) allows; None when
    the field also takes a boolean, or is not such a literal."""
    if typing.get_origin(annotation) is Literal:
        values = typing.get_args(annotation)
        return None if any(isinstance(v, bool) for v in values) else {v for v in values if isinstance(v, str)}
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        words: set[str] = set()
        for arg in typing.get_args(annotation):
            if arg is bool:
                return None
            found = _literal_words(arg) if arg is not type(None) else set()
            if found is None:
                return None
            words |= found
        return words
    return None


def _takes_bool(annotation: object) -> bool:
    """The field's annotation admits a boolean (``bool``, ``bool | None``, ...)."""
    if annotation is bool:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_takes_bool(arg) for arg in typing.get_args(annotation))
    return False


def _as_meant(annotation: object, value: object) -> object:
    """``value`` as the field meant it where it is a YAML 1.1 boolean word (``off``; read as a
    word by :func:`~raysoft.config.load_yaml`) or a boolean (a mapping from code or an older
    reader): the word for a choice of words that has it, the boolean for a key that takes one."""
    words = _literal_words(annotation)
    if isinstance(value, str) and value.lower() in BOOL_WORDS:
        if words and value.lower() in words:
            return value.lower()
        if _takes_bool(annotation):
            return BOOL_WORDS[value.lower()]
        return next((w for w in _YAML_WORDS[BOOL_WORDS[value.lower()]] if words and w in words), value)
    if isinstance(value, bool):
        return next((w for w in _YAML_WORDS[value] if words and w in words), value)
    return value


def nearest(key: str, known: list[str]) -> str:
    """`` (did you mean `x`?)`` for the known key nearest to ``key``, or ``""`` when none is near."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.7)
    return f" (did you mean `{close[0]}`?)" if close else ""


class Section(BaseModel):
    """Base of every config section: frozen, strict types, unknown keys rejected (naming the
    nearest known key), and the words ``on``/``off``/``yes``/``no`` taken as a boolean where the
    key takes one (``train.shuffle: yes``), as the word where the key is a choice of words that
    has it (``train.batched_clients: off``, also when YAML 1.1 read it as a boolean)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _section_raw_keys(cls, raw: object) -> object:
        if not isinstance(raw, Mapping):
            return raw
        fields = cls.model_fields
        for key in raw if cls.model_config.get("extra") == "forbid" else ():  # a plug-in may allow extra keys
            if key not in fields:
                hint = nearest(key, sorted(fields)) if isinstance(key, str) else ""
                raise ValueError(at(str(key), UNKNOWN_KEY + hint))
        fixed: dict[object, object] | None = None
        for key, value in raw.items():
            if key in fields and isinstance(value, (bool, str)):
                meant = _as_meant(fields[key].annotation, value)
                if meant is not value:
                    fixed = dict(raw) if fixed is None else fixed
                    fixed[key] = meant
        return raw if fixed is None else fixed


class PluginSection(Section):
    """A section that names a plug-in (``algorithm``, ``data``, ``model``, each callback): its
    :attr:`plugin` is the record looked up when the config was parsed (:func:`raysoft.plugins.lookup`)."""

    KIND: ClassVar[str]
    name: str

    @property
    def plugin(self) -> Plugin:
        """The plug-in ``name`` names (:class:`raysoft.plugins.Plugin`): its settings class,
        whether it is a built-in, and ``load()`` for its code."""
        return lookup(self.KIND, self.name)


def at(key: str, message: str) -> str:
    """A validator's message about ``key`` inside its field: :func:`format_error` moves the key
    into the error's location (``section.key: message``)."""
    return f"[at:{key}] {message}"


AT_NAME = at("name", "")


def _strip_marker(msg: str) -> tuple[str | None, str]:
    if msg.startswith("[at:") and "] " in msg:
        key, rest = msg[len("[at:"):].split("] ", 1)
        return key, rest
    return None, msg


def format_error(err: ValidationError) -> str:
    """The first error of ``err`` as one line, ``location: message``."""
    e = err.errors()[0]
    # pydantic puts the dispatched model's name into the location; drop non-key parts
    loc = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and p[:1].isupper()))
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        msg = UNKNOWN_KEY
    elif msg.startswith("Value error, "):
        key, msg = _strip_marker(msg[len("Value error, "):])
        if key is not None:
            inner, msg = _strip_marker(msg)  # an item's own key
            key = f"{key}.{inner}" if inner is not None else key
            loc = f"{loc}.{key}" if loc else key
    elif e["type"] == "missing":
        msg = "required key is missing"
    if e["type"] not in ("extra_forbidden", "missing", "value_error") and "input" in e:
        msg = f"{msg} (got {e['input']!r})"
    return f"{loc}: {msg}" if loc else msg
