"""Typed, validated experiment configuration.

A config is YAML with the top-level sections ``seed``, ``algorithm``, ``data``, ``model``,
``train``, ``ray``, ``output``, ``faults``, ``callbacks`` and ``clock``. Every section is a
frozen pydantic model that forbids unknown keys and checks types strictly, so a typo fails
before Ray starts. The ``algorithm``, ``data``, ``model`` and ``callbacks`` sections are
dispatched on their ``name`` to the settings class of the plug-in it names
(:mod:`raysoft.plugins`; the built-ins are plug-ins too, their settings in
:mod:`raysoft.algorithms.settings` and :mod:`raysoft.catalog`), so each algorithm declares
exactly the hyper-parameters it has.

One module a concern: :mod:`.section` (the base, one-line errors), one module a section
(:mod:`.algorithm`, :mod:`.data`, :mod:`.model`, :mod:`.train`, :mod:`.backend` for ``ray``,
:mod:`.output`, :mod:`.clock`, :mod:`.faults`, :mod:`.callbacks`), :mod:`.experiment` (the whole
config and the rules across sections), :mod:`.regimes`, :mod:`.overrides` (``--set``),
:mod:`.yamlio` (YAML read as ML people write it: ``1e-3`` a number) and :mod:`.loading` (YAML
files and validation).

Bad input raises :class:`ConfigError` whose message is one line naming the key and the problem.
"""

from ..errors import ConfigError
from .algorithm import AlgorithmConfig, Sections
from .backend import RayConfig
from .callbacks import CallbackConfig
from .clock import ClockConfig
from .data import PARTITIONS, DataConfig
from .experiment import Config
from .faults import Fault
from .loading import load_config, load_raw, load_saved_config, parse_config
from .model import ModelConfig
from .output import OutputConfig, name_problem
from .overrides import apply_overrides
from .regimes import COMPARE_DEFAULT, REGIME_SECTIONS, apply_regime
from .section import Section, format_error
from .train import TrainConfig
from .yamlio import load_yaml

__all__ = [
    "COMPARE_DEFAULT", "PARTITIONS", "REGIME_SECTIONS", "AlgorithmConfig", "CallbackConfig", "ClockConfig", "Config",
    "ConfigError", "DataConfig", "Fault", "ModelConfig", "OutputConfig", "RayConfig", "Section", "Sections",
    "TrainConfig",
    "apply_overrides", "apply_regime", "format_error", "load_config", "load_raw", "load_saved_config",
    "load_yaml", "name_problem", "parse_config",
]
