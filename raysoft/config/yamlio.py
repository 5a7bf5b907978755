"""YAML as ML people write it: ``1e-3`` is a number.

PyYAML reads YAML 1.1, whose floats need a dot (``1.0e-3``); ``5e-3`` becomes the string
``'5e-3'``. Every config, sweep file and ``--set`` value is read with :func:`load_yaml`, which
reads such a scientific literal as a float and is otherwise ``yaml.safe_load``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

SCIENTIFIC = re.compile(r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)[eE][-+]?[0-9]+$")
"""``1e-3``, ``5E4``, ``-2.5e+1``, ``1.e-3``: a number to a user, a string to YAML 1.1."""


class ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-3`` as a float."""


ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", SCIENTIFIC, list("-+0123456789."))


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)`` with ``1e-3`` read as a float."""
    return yaml.load(text, Loader=ConfigLoader)
