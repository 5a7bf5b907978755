"""raysoft: soft- and hard-clustered federated learning simulated on Ray."""

import os

# MKL's matrix products otherwise round differently with the memory alignment of their inputs,
# which differs between processes: the same seed must give the same numbers whatever the
# packing of clients into actors. Read at MKL's first call, so set before any (a user's own
# setting wins). docs/architecture.md#determinism says why and what it costs.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

from .api import RunResult, resume, run
from .config import Config, ConfigError, load_config
from .errors import RaysoftError

__all__ = ["Config", "ConfigError", "RaysoftError", "RunResult", "load_config", "resume", "run"]
__version__ = "0.1.0"
