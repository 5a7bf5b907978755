"""The types of JSON-like data (what ``json.loads`` gives, what a summary or event holds):
named here so that an annotation says what a value is instead of ``Any``."""

from __future__ import annotations

from typing import TypeAlias

# a JSON value: what json.dumps writes and json.loads reads back (tuples are written as lists)
JSON: TypeAlias = "None | bool | int | float | str | list[JSON] | dict[str, JSON]"
JSONDict: TypeAlias = "dict[str, JSON]"
