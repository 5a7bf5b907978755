"""The command-line options that raysoft's commands and the analysis scripts of ``analysis/`` share, each
defined once: ``--set`` (config overrides), ``--address`` and ``--token-file`` (joining a cluster)
and ``--progress``. argparse, the standard library's, builds every command: its usage errors are
the one-line exit-2 refusals the rest of raysoft gives (docs/architecture.md#libraries)."""

from __future__ import annotations

import argparse
from typing import get_args

from .config import OutputConfig

PROGRESS_MODES = get_args(OutputConfig.model_fields["progress"].annotation)  # output.progress's values


def add_overrides(parser: argparse.ArgumentParser) -> None:
    """``--set path.to.key=value`` (repeatable) into ``args.overrides``: config overrides, the value
    read as YAML (:func:`raysoft.config.apply_overrides`)."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config value, at any depth (repeatable)")


def add_cluster(parser: argparse.ArgumentParser, jobs_api: bool = False) -> None:
    """``--address`` and ``--token-file``: the Ray cluster a command joins, and its token;
    ``jobs_api``: the command also takes a Jobs API address (``raysoft run`` submits itself there)."""
    forms = "host:port (a head's GCS, e.g. 127.0.0.1:6379), auto, " + (
        "ray://host:10001, or http://host:8265 (the Jobs API: run as a Ray Job)" if jobs_api else "or ray://host:10001")
    parser.add_argument("--address", help=f"Ray address to join: {forms}")
    parser.add_argument("--token-file", help="the cluster's authentication token (default: RAY_AUTH_TOKEN, "
                                             "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)")


def add_progress(parser: argparse.ArgumentParser) -> None:
    """``--progress``: how a run shows its rounds (overrides output.progress)."""
    parser.add_argument("--progress", choices=PROGRESS_MODES, help="progress display (overrides output.progress)")


TRACEBACK_ENV = "RAYSOFT_TRACEBACK"  # set to 1: every command shows an error's whole traceback


def add_traceback(parser: argparse.ArgumentParser) -> None:
    """``--traceback``: an error's whole traceback on stderr before its one line (the plug-in's
    own, from wherever it ran); ``RAYSOFT_TRACEBACK=1`` does the same for every command."""
    parser.add_argument("--traceback", action="store_true",
                        help=f"on an error, show its whole traceback before the one line (or set {TRACEBACK_ENV}=1)")


def wants_traceback(args: argparse.Namespace) -> bool:
    """``--traceback`` was given, or ``RAYSOFT_TRACEBACK`` is set to a true value."""
    import os

    return bool(getattr(args, "traceback", False)) or os.environ.get(TRACEBACK_ENV, "").strip().lower() in (
        "1", "true", "yes", "on")
