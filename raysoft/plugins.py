"""Plug-ins: how a name in a config becomes the algorithm, model, dataset or callback it names.

A config's ``algorithm.name``, ``model.name``, ``data.name`` and ``callbacks[].name`` are each
one of

* a name registered by an installed package in the entry-point group of its kind
  (:data:`GROUPS`: ``raysoft.algorithms``, ``raysoft.models``, ``raysoft.datasets``,
  ``raysoft.callbacks``). raysoft's own built-ins are registered there too, by raysoft's
  ``pyproject.toml``: there is no second path for them;
* an import path ``package.module:Name`` (``Name`` may be dotted: ``module:Outer.Inner``). The
  module is imported as Python would, with the current directory first on ``sys.path``, so a
  ``fedprox.py`` beside the job file is ``fedprox:FedProx`` when the run starts there.

:func:`lookup` finds what a name names, once per process: a :class:`Plugin` record (its settings
class, whether raysoft ships it, whether it is named by import path). A config looks each of its
plug-ins up when it is parsed, and the run reads those records from the config (``cfg.plugins``,
each section's ``plugin``) rather than asking this module by name. :meth:`Plugin.load`
(:func:`resolve`) imports the plug-in's code, checks that it implements its kind's protocol (the
error names the missing method) and caches it. Every failure is a :class:`PluginError`, one line
naming the plug-in, raised before Ray starts. :func:`ship_paths` lists the files and folders of
the plug-ins a config names by import path that are not installed packages: the Ray backend
ships them to every actor with Ray's runtime environment (``py_modules``), so a plug-in runs on
a cluster without the user copying files.

The protocols themselves are documented in ``docs/plugins.md``.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as md
import inspect
import os
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from .errors import ConfigError, one_line

GROUPS = {
    "algorithms": "raysoft.algorithms",
    "models": "raysoft.models",
    "datasets": "raysoft.datasets",
    "callbacks": "raysoft.callbacks",
}
KIND_WORD = {"algorithms": "algorithm", "models": "model", "datasets": "dataset", "callbacks": "callback"}


class PluginError(ConfigError):
    """A plug-in cannot be used (it does not import, lacks an attribute or a protocol method, has
    bad settings, or its name is registered twice); the message is one line naming it."""


@dataclass(frozen=True)
class Registered:
    """One entry of an entry-point group: its name, ``module:attr`` and the distribution that
    registers it."""

    name: str
    value: str
    dist: str


# the settings base class of each kind (raysoft.config registers them when it is imported)
BASES: dict[str, type[BaseModel]] = {}


def register_bases(**bases: type[BaseModel]) -> None:
    """Set the settings base class of each kind (``algorithms=AlgorithmConfig``, ...)."""
    BASES.update(bases)


_REGISTRY: dict[str, dict[str, Registered]] = {}
_TARGETS: dict[tuple[str, str], Any] = {}
_RESOLVED: dict[tuple[str, str], Any] = {}
_LOOKED_UP: dict[tuple[str, str], Plugin] = {}


def clear_cache() -> None:
    """Forget what was read and imported (tests that install a package of entry points)."""
    _REGISTRY.clear()
    _TARGETS.clear()
    _RESOLVED.clear()
    _LOOKED_UP.clear()


def _check_kind(kind: str) -> str:
    if kind not in GROUPS:
        raise PluginError(f"unknown kind of plug-in {kind!r} (known: {', '.join(GROUPS)})")
    return kind


def registered(kind: str) -> dict[str, Registered]:
    """Every name registered in ``kind``'s entry-point group, by name. A name that two
    distributions register with different targets is a :class:`PluginError`."""
    _check_kind(kind)
    if kind in _REGISTRY:
        return _REGISTRY[kind]
    found: dict[str, Registered] = {}
    for ep in md.entry_points(group=GROUPS[kind]):
        dist = ep.dist.name if ep.dist is not None else "?"
        entry = Registered(ep.name, ep.value, dist)
        seen = found.get(ep.name)
        if seen is not None and seen.value != entry.value:
            raise PluginError(f"{KIND_WORD[kind]} {ep.name!r} is registered twice: as {seen.value} by {seen.dist} "
                              f"and as {entry.value} by {entry.dist} (entry-point group {GROUPS[kind]})")
        found[ep.name] = entry
    if kind == "algorithms" and not any(r.dist == "raysoft" for r in found.values()):
        raise PluginError("raysoft's built-in algorithms are not registered: install the package "
                          "(pip install -e . in the repository) rather than putting it on PYTHONPATH")
    _REGISTRY[kind] = found
    return found


def is_import_path(name: str) -> bool:
    return ":" in name


def short_name(name: str) -> str:
    """A plug-in's name as a file name: ``Name`` of an import path ``module:Name`` (no ':' in run
    folders), the name itself otherwise."""
    return name.rpartition(":")[2]


def _import_attr(path: str, what: str) -> Any:
    """The object ``module:attr`` names, imported with the current directory on sys.path."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise PluginError(f"{what}: {path!r} is not an import path (expected package.module:Name)")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise PluginError(f"{what}: cannot import module {module_name!r} (not found from {cwd} or the "
                              "installed packages)") from None
        raise PluginError(f"{what}: importing {module_name!r} failed: {type(err).__name__}: {one_line(err)}") from None
    except Exception as err:  # noqa: BLE001 - whatever the user's module raises, one line
        raise PluginError(f"{what}: importing {module_name!r} failed: {type(err).__name__}: {one_line(err)}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"{what}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def did_you_mean(name: str, known: list[str]) -> str:
    """`` (did you mean `x`?)`` for the known name nearest to a misspelled ``name`` (difflib, as
    the config's keys say it), or ``""`` when none is near."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def target(kind: str, name: str) -> Any:
    """What ``name`` names in ``kind``, imported (not checked): a plug-in, or a declaration (a
    settings class whose ``implementation`` names the plug-in's code, imported later)."""
    _check_kind(kind)
    key = (kind, name)
    if key in _TARGETS:
        return _TARGETS[key]
    word = KIND_WORD[kind]
    if not isinstance(name, str) or not name:
        raise PluginError(f"{word} name must be a non-empty string (got {name!r})")
    what = f"{word} {name!r}"
    if is_import_path(name):
        obj = _import_attr(name, what)
    else:
        table = registered(kind)
        if name not in table:
            raise PluginError(f"unknown {word} {name!r}{did_you_mean(name, list(table))} (known: "
                              f"{', '.join(sorted(table))}; or an import path package.module:Name)")
        obj = _import_attr(table[name].value, f"{what} (registered by {table[name].dist})")
    _TARGETS[key] = obj
    return obj


def is_declaration(kind: str, obj: Any) -> bool:
    """``obj`` is a settings class of ``kind`` that names its implementation (a lazy plug-in)."""
    return inspect.isclass(obj) and issubclass(obj, BASES[kind]) and bool(getattr(obj, "implementation", None))


def resolve(kind: str, name: str) -> Any:
    """The class (or, for models, the factory) that ``name`` names in ``kind``, imported and
    checked against the kind's protocol; :class:`PluginError` (one line) if it cannot be used."""
    key = (kind, name)
    if key in _RESOLVED:
        return _RESOLVED[key]
    obj = target(kind, name)
    what = f"{KIND_WORD[kind]} {name!r}"
    if is_declaration(kind, obj):
        declared = obj
        obj = _import_attr(declared.implementation, f"{what} (its implementation)")
        own = getattr(obj, "Settings", None)
        if own is not None and not (inspect.isclass(own) and issubclass(declared, own)):
            raise PluginError(f"{what}: its implementation's Settings ({own.__name__}) is not "
                              f"{declared.__name__} (the settings class that names it)")
        CHECKS[kind](obj, what, declared)
    else:
        CHECKS[kind](obj, what, None)
    _RESOLVED[key] = obj
    return obj


# --------------------------------------------------------------------------- protocols
ALGORITHM_METHODS = ("init_server", "init_client", "round", "eval_payload")  # centers, weights: optional
STREAM_METHODS = ("first_anchor", "receive", "init_stream_server", "cold_start", "server_step")
DATASET_METHODS = ("client", "holdout")
CALLBACK_METHODS = ("on_rows", "on_end")


def _missing(cls: type, methods: Iterable[str]) -> list[str]:
    return [m for m in methods if not callable(getattr(cls, m, None))]


def _settings_of(obj: Any, kind: str, what: str, declared: type | None = None) -> type:
    base = BASES[kind]
    settings = declared or getattr(obj, "Settings", base)
    if not (isinstance(settings, type) and issubclass(settings, base)):
        raise PluginError(f"{what}: its Settings must be a subclass of raysoft.sdk.{base.__name__} (got {settings!r})")
    return settings


def stream_base(cls: type) -> type | None:
    """The stream template (raysoft.sdk.StreamAlgorithm) among ``cls``'s bases, or None for a
    synchronous algorithm: the class that declares ``stream = True``."""
    return next((c for c in cls.__mro__ if vars(c).get("stream") is True), None)


def _check_algorithm(obj: Any, what: str, declared: type | None = None) -> None:
    if not inspect.isclass(obj):
        raise PluginError(f"{what}: must be a class (got {type(obj).__name__})")
    if declared is None and not any("Settings" in vars(c) for c in obj.__mro__[:-1]):
        raise PluginError(f"{what}: has no Settings (a subclass of raysoft.sdk.AlgorithmConfig)")
    _settings_of(obj, "algorithms", what, declared)
    template = stream_base(obj)
    if template is not None and not getattr(declared or getattr(obj, "Settings", None), "stream", False):
        raise PluginError(f"{what}: a stream algorithm's Settings must be a subclass of raysoft.sdk.StreamConfig")
    if template is not None:
        if callable(getattr(obj, "init_server", None)):  # the hook's earlier name, a synchronous algorithm's
            raise PluginError(f"{what}: a stream's init_server(models) is now init_stream_server(models): rename it")
        # every hook the engine calls and the template leaves open (``models``: with a server)
        server: bool = getattr(obj, "has_server", True)
        required = STREAM_METHODS + (("models",) if server else ())
        missing = [m for m in required if getattr(obj, m) is getattr(template, m)]
        if missing:
            raise PluginError(f"{what}: a stream algorithm must implement {', '.join(missing)} "
                              "(the hooks of raysoft.sdk.StreamAlgorithm)")
        return
    missing = _missing(obj, ALGORITHM_METHODS)
    if missing:
        raise PluginError(f"{what}: does not implement the algorithm protocol: missing method "
                          f"{', '.join(missing)}")


def _check_model(obj: Any, what: str, declared: type | None = None) -> None:
    if not callable(obj):
        raise PluginError(f"{what}: must be callable as (settings, info, generator) -> torch.nn.Module")
    _settings_of(obj, "models", what, declared)


def _class_with(kind: str, methods: tuple[str, ...]):
    """The check of a kind whose plug-in is a class with ``methods`` (datasets, callbacks)."""
    word = KIND_WORD[kind]

    def check(obj: Any, what: str, declared: type | None = None) -> None:
        if not inspect.isclass(obj):
            raise PluginError(f"{what}: must be a class (got {type(obj).__name__})")
        _settings_of(obj, kind, what, declared)
        missing = _missing(obj, methods)
        if missing:
            raise PluginError(f"{what}: does not implement the {word} protocol: missing method {', '.join(missing)}")

    return check


CHECKS = {"algorithms": _check_algorithm, "models": _check_model, "datasets": _class_with("datasets", DATASET_METHODS),
          "callbacks": _class_with("callbacks", CALLBACK_METHODS)}


def is_builtin(kind: str, name: str) -> bool:
    """``name`` is one of raysoft's own (registered by the raysoft distribution)."""
    entry = registered(kind).get(name) if not is_import_path(name) else None
    return entry is not None and entry.dist == "raysoft"


def is_stream_algorithm(name: str) -> bool:
    """The algorithm ``name`` names is an asynchronous stream: its settings are a StreamConfig
    (which a stream algorithm's must be), read without importing its code."""
    return lookup("algorithms", name).stream


@dataclass(frozen=True)
class Plugin:
    """One plug-in a config names, as :func:`lookup` found it.

    * ``kind``: ``algorithms``, ``models``, ``datasets`` or ``callbacks``; ``name``: as the
      config gives it (a registered name or an import path);
    * ``settings``: its settings class (a declaration's own, its code not imported yet);
    * ``builtin``: raysoft registers it (the engine knows its data and model without
      importing it); ``by_path``: named by import path (shipped to the actors when it is not
      installed, :func:`ship_paths`); ``stream``: an asynchronous stream algorithm;
    * :meth:`load`: the plug-in's code, imported and checked against its kind's protocol
      (:func:`resolve`, once per process)."""

    kind: str
    name: str
    settings: type[BaseModel]
    builtin: bool

    @property
    def by_path(self) -> bool:
        return is_import_path(self.name)

    @property
    def stream(self) -> bool:
        return bool(getattr(self.settings, "stream", False))

    def load(self) -> Any:
        """The class (for models, the factory) the plug-in names, imported and checked."""
        return resolve(self.kind, self.name)


def lookup(kind: str, name: str) -> Plugin:
    """The :class:`Plugin` record of ``name`` in ``kind`` (once per process): its settings class
    is a declaration itself (its code is not imported), else the plug-in's ``Settings`` or the
    kind's base section, the plug-in being checked against its protocol; a
    :class:`PluginError` (one line) when it cannot be used."""
    key = (kind, name)
    found = _LOOKED_UP.get(key)
    if found is not None:
        return found
    obj = target(kind, name)
    settings = obj if is_declaration(kind, obj) else getattr(resolve(kind, name), "Settings", BASES[kind])
    if "plugin" in getattr(settings, "model_fields", {}):
        raise PluginError(f"{KIND_WORD[kind]} {name!r}: its settings may not have a key named 'plugin' (a section's "
                          "plugin is the record of the plug-in it names): rename the key")
    found = _LOOKED_UP[key] = Plugin(kind, name, settings, is_builtin(kind, name))
    return found


def settings_class(kind: str, name: str) -> type[BaseModel]:
    """The settings class of the plug-in ``name`` of ``kind`` (:func:`lookup`)."""
    return lookup(kind, name).settings


def settings_keys(kind: str, name: str) -> set[str]:
    """The keys of the plug-in ``name``'s settings (:func:`settings_class`); empty when it cannot
    be read (it says why where a config names it)."""
    try:
        return set(settings_class(kind, name).model_fields)
    except (ConfigError, ValueError):
        return set()


def state_types() -> list[type]:
    """The classes a checkpoint may hold for the plug-ins this process has resolved, beyond
    raysoft's own: each one's ``state_types`` and every class its module defines."""
    out: list[type] = []
    for obj in [*_TARGETS.values(), *_RESOLVED.values()]:
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        if module is None or module.__name__.split(".")[0] == "raysoft":
            continue
        out += [t for t in getattr(obj, "state_types", ()) if isinstance(t, type)]
        out += [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]
    return out


# --------------------------------------------------------------------------- shipping
def _installed_roots() -> list[Path]:
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    roots.update(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))
    return [Path(r).resolve() for r in roots if r]


class Named(Protocol):
    """What :func:`ship_paths` reads of a config: the plug-ins it names (``Config.plugins``)."""

    @property
    def plugins(self) -> list[Plugin]: ...


def ship_paths(cfg: Named) -> list[str]:
    """The files or folders to ship to the actors (Ray's ``py_modules``) for the plug-ins the
    config names by import path: each top-level module's file (``fedprox.py``) or package
    folder, unless it is installed (site-packages) or part of raysoft."""
    installed = _installed_roots()
    here = Path(__file__).resolve().parent
    paths: list[str] = []
    for plugin in cfg.plugins:
        if not plugin.by_path:
            continue
        found = (target(plugin.kind, plugin.name), plugin.load())  # a declaration's module and its code's
        modules = {getattr(obj, "__module__", "") for obj in found}
        for module_name in sorted(m for m in modules if m):
            origin = getattr(sys.modules.get(module_name.split(".")[0]), "__file__", None)
            if origin is None:
                continue
            path = Path(origin).resolve()
            if path.name == "__init__.py":
                path = path.parent
            if path == here or here in path.parents or any(root in path.parents for root in installed):
                continue
            if str(path) not in paths:
                paths.append(str(path))
    return paths


def runtime_env(cfg: Named) -> dict[str, Any] | None:
    """The job-level Ray runtime environment (for ``ray.init``, which uploads local paths) that
    makes the config's plug-ins importable in every worker of the job, or None when every plug-in
    is installed (or built in)."""
    paths = ship_paths(cfg)
    return {"py_modules": paths} if paths else None


def ensure_importable(paths: Iterable[str]) -> None:
    """Put the folders of shipped plug-in modules on sys.path when they are on this node (a Tune
    trial on the driver's machine, or a shared file system)."""
    for p in paths:
        folder = str(Path(p).parent)
        if Path(p).exists() and folder not in sys.path:
            sys.path.insert(0, folder)
