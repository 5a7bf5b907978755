"""YAML as ML people write it: ``1e-3`` is a number, ``off`` a word.

PyYAML reads YAML 1.1, whose floats need a dot (``1.0e-3``), so ``5e-3`` becomes the string
``'5e-3'``, and whose booleans include ``on``, ``off``, ``yes`` and ``no`` (any case), so
``batched_clients: off`` becomes ``False``. Every config, sweep file and ``--set`` value is read
with :func:`load_yaml`, which reads such a scientific literal as a float and only ``true`` and
``false`` as booleans (as YAML 1.2 does), and is otherwise ``yaml.safe_load``. A key that takes a
boolean takes the four words as well (:class:`raysoft.config.Section`: ``shuffle: yes``).
"""

from __future__ import annotations

import re

import yaml

SCIENTIFIC = re.compile(r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)[eE][-+]?[0-9]+$")
"""``1e-3``, ``5E4``, ``-2.5e+1``, ``1.e-3``: a number to a user, a string to YAML 1.1."""


class ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-3`` as a float."""


ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", SCIENTIFIC, list("-+0123456789."))

BOOL_WORDS = {"on": True, "yes": True, "off": False, "no": False}
"""The words YAML 1.1 reads as booleans besides true and false (any case), and what they mean."""


def load_yaml(text: str) -> object:
    """``yaml.safe_load(text)`` with ``1e-3`` read as a float."""
    return yaml.load(text, Loader=ConfigLoader)
