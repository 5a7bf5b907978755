"""raysoft: soft- and hard-clustered federated learning simulated on Ray.

The package's front door for Python: ``run`` (one experiment from a config file, a dict or a
:class:`Config`, returning a :class:`RunResult` with its run directory), ``resume`` (a run from its
last checkpoint), ``load_config`` (a YAML file with ``--set``-style overrides, validated) and the
errors a caller may catch. Importing it also pins MKL's rounding (below), so that the same seed
gives the same numbers in every process. The command line is :mod:`raysoft.cli`; plug-ins import
:mod:`raysoft.sdk`.
"""

import os

# MKL's matrix products otherwise round differently with the memory alignment of their inputs,
# which differs between processes: the same seed must give the same numbers whatever the
# packing of clients into actors. Read at MKL's first call, so set before any (a user's own
# setting wins). docs/architecture.md#determinism says why and what it costs.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
# cuBLAS's deterministic workspace, read when CUDA starts: set before anything of raysoft can start
# it, in the driver and in every actor (devices.CUBLAS_WORKSPACE; a user's own setting wins)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

from .api import RunResult, resume, run
from .config import Config, ConfigError, load_config
from .errors import RaysoftError

__all__ = ["Config", "ConfigError", "RaysoftError", "RunResult", "load_config", "resume", "run"]
__version__ = "0.1.0"
