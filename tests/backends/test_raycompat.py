"""Ray's private APIs, behind raysoft/backends/raycompat.py only: no other module of the package
reaches into ``ray._private`` or ``ray._raylet`` (read from the source, nothing imported), and each
wrapper falls back as its module's table says when the private API is missing."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest
from support.paths import SOURCE

from raysoft.backends import raycompat
from raysoft.errors import RunFailure

PRIVATE = ("ray._private", "ray._raylet")
COMPAT = SOURCE / "backends" / "raycompat.py"


def private_uses(path: Path) -> list[str]:
    """``line: what`` for every import of, or attribute path through, Ray's private modules in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            parts, e = [node.attr], node.value
            while isinstance(e, ast.Attribute):
                parts.append(e.attr)
                e = e.value
            if isinstance(e, ast.Name):
                names = [".".join([e.id, *reversed(parts)])]
        hits = [n for n in names if any(n == p or n.startswith(p + ".") for p in PRIVATE)]
        if hits and not any(f.startswith(f"{node.lineno}: ") for f in found):  # an attribute path once
            found.append(f"{node.lineno}: {hits[0]}")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


def test_no_module_but_raycompat_uses_rays_private_api():
    offenders = {str(p.relative_to(SOURCE)): uses for p in sorted(SOURCE.rglob("*.py"))
                 if p != COMPAT and (uses := private_uses(p))}
    assert offenders == {}, f"use raysoft/backends/raycompat.py instead: {offenders}"
    assert private_uses(COMPAT)  # the scan does see them where they are


def test_the_scan_finds_imports_and_attribute_paths(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import ray._private.services\nfrom ray._raylet import GcsClient\n"
                   "from ray import _private\nnode = ray._private.worker._global_node\nimport ray.util\n")
    assert [u.split(":")[0] for u in private_uses(src)] == ["1", "2", "3", "4"]


@pytest.fixture
def no_private(monkeypatch):
    """Ray's private modules fail to import into raysoft (Ray's own imports of them still work),
    as in a Ray that moved them."""
    real = builtins.__import__

    def fake(name, globals=None, locals=None, fromlist=(), level=0):
        importer = (globals or {}).get("__name__", "")
        private = any(name == p or name.startswith(p + ".") for p in PRIVATE)
        if level == 0 and private and importer.startswith("raysoft"):
            raise ImportError(f"No module named {name!r}")
        return real(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", fake)


def test_each_wrapper_falls_back_without_the_private_api(no_private):
    assert raycompat.enable_token_auth() is None
    assert raycompat.local_resources(2) is None
    assert raycompat.started_here() is False
    assert raycompat.local_ray_pids() == []
    assert raycompat.bootstrap_address() is None
    with pytest.raises(raycompat.RayCompatError) as err:
        raycompat.upload_py_modules(["/x/plugin.py"], "/tmp")
    assert isinstance(err.value, RunFailure) and "\n" not in str(err.value)
    assert "upload_py_modules_if_needed" in str(err.value) and "install the plug-ins on the cluster" in str(err.value)


def test_with_rays_private_api_the_local_node_is_detected():
    found = raycompat.local_resources(3)
    assert found is not None and found["CPU"] == 3.0 and found["GPU"] >= 0


def test_the_local_cluster_falls_back_to_the_cpu_count(no_private):
    from raysoft.backends.cluster import local_cluster
    from raysoft.config import RayConfig

    cluster = local_cluster(RayConfig(num_cpus=3))
    assert cluster is not None and cluster.nodes == ({"CPU": 3.0},)
    assert local_cluster(RayConfig(num_cpus=3, num_gpus_per_actor=0.5)) is None
