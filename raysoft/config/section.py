"""The base of every config section, and how a section's validation error becomes one line.

A validator that knows which key inside its section is wrong marks its message with
:func:`at`; :func:`format_error` turns pydantic's error into ``section.key: message``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class Section(BaseModel):
    """Base of every config section: frozen, strict types, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


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
        msg = "unknown key"
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
