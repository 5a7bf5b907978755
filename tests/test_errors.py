"""raysoft's error family: every error it raises on purpose is a RaysoftError, refusals exit 2 and
run failures exit 1, and the one-line helpers say what they promise."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pytest

import raysoft
from raysoft import cli
from raysoft.errors import (
    ClientFailure,
    ConfigError,
    DataFileError,
    MissingDataError,
    PluginFailure,
    RaysoftError,
    Refusal,
    ReportError,
    RunFailure,
    RunStopped,
    UpdateError,
    error_line,
    exit_code,
    first_line,
    plugin_call,
)
from raysoft.plugins import PluginError

# standalone scripts run in other environments (they import no raysoft module): none in the
# package since the peers' harnesses moved to the checkout's benchmarks/
STANDALONE: set[str] = set()


def _own_exceptions():
    for info in pkgutil.walk_packages(raysoft.__path__, "raysoft."):
        if info.name in STANDALONE or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            # public errors: a private one is raised and caught inside its module; a signal's
            # Interrupted is a KeyboardInterrupt on purpose (exit 128 + signal number)
            if issubclass(obj, Exception) and obj.__module__ == info.name and not obj.__name__.startswith("_"):
                yield obj


def test_every_error_raysoft_defines_is_in_the_family():
    found = set(_own_exceptions())
    assert {ConfigError, ReportError, ClientFailure} <= found
    outside = sorted(c.__qualname__ for c in found if not issubclass(c, RaysoftError))
    assert outside == [], f"errors outside RaysoftError: {outside}"


@pytest.mark.parametrize("cls, code, builtin", [
    (ConfigError, 2, ValueError), (PluginError, 2, ValueError), (MissingDataError, 2, FileNotFoundError),
    (DataFileError, 2, ValueError), (ReportError, 2, ValueError),
    (ClientFailure, 1, RuntimeError), (UpdateError, 1, RuntimeError), (PluginFailure, 1, RuntimeError),
    (RunStopped, 1, RuntimeError),
])
def test_each_error_has_its_kind_its_exit_code_and_its_old_builtin(cls, code, builtin):
    err = cls("the problem")
    assert isinstance(err, Refusal if code == 2 else RunFailure)
    assert isinstance(err, builtin)  # callers that caught the built-in still do
    assert exit_code(err) == code
    again = pickle.loads(pickle.dumps(err))  # crosses a Ray actor boundary intact
    assert type(again) is cls and str(again) == "the problem"


def test_anything_else_exits_1():
    assert exit_code(KeyError("k")) == 1


def test_the_cli_maps_the_family_to_its_exit_codes(monkeypatch, capsys):
    import raysoft.listing

    def refuse(kind, names):
        raise MissingDataError("fmnist: no files in /nowhere\n(set data.root)")

    def stop(kind, names):
        raise UpdateError("client 3 returned NaN")

    monkeypatch.setattr(raysoft.listing, "main", refuse)
    assert cli.main(["list", "models"]) == 2
    assert capsys.readouterr().err == "raysoft: error: fmnist: no files in /nowhere (set data.root)\n"
    monkeypatch.setattr(raysoft.listing, "main", stop)
    assert cli.main(["list", "models"]) == 1
    assert capsys.readouterr().err == "raysoft: run stopped: client 3 returned NaN\n"


def test_the_one_line_helpers():
    err = ValueError("first\n  second line\n")
    err.add_note("a note")
    assert error_line(err) == "first second line. a note"
    ended = RuntimeError("stopped.")
    ended.add_note("The run directory is kept.")
    assert error_line(ended) == "stopped. The run directory is kept."
    assert first_line(err) == "first"
    assert first_line(RuntimeError("\n\n  the cause  \ntraceback")) == "the cause"
    assert first_line(KeyError()) == "KeyError" == error_line(KeyError())


def test_plugin_call_wraps_foreign_errors_and_passes_its_own():
    def boom(x):
        raise ZeroDivisionError(f"divided {x}\nby zero")

    with pytest.raises(PluginFailure, match=r"^client 2 train: ZeroDivisionError: divided 1 by zero "
                                            r"\(at \S*test_errors.py:\d+\)$") as err:
        plugin_call(boom, (1,), "client 2 train")
    line = boom.__code__.co_firstlineno + 1
    assert str(err.value).endswith(f"test_errors.py:{line})")  # the user's line, not raysoft's
    assert "ZeroDivisionError: divided 1\nby zero" in err.value.trace

    def refuse():
        raise ConfigError("algorithm.mu: must be >= 0")

    with pytest.raises(ConfigError, match="algorithm.mu"):
        plugin_call(refuse, (), "here")
    assert plugin_call(lambda a, b: a + b, (2, 3), "here") == 5
