"""Every shell command that README.md and docs/*.md show works as written, with small settings
added (mostly ``--set``) so that a paper-scale command finishes in seconds.

A command is a line of a fenced ``sh`` block (continuation lines joined, comments dropped).
Each is one of:

- **run**: ``raysoft ...``, ``.venv/bin/raysoft ...`` and ``.venv/bin/python jobs/...``: run in a
  copy of ``jobs/`` (so that nothing is written into the tree) with the small settings of
  :data:`SMALL` added, and must exit 0;
- **a synopsis** (``CONFIG``, ``RUN_DIR``, ``[--option ...]``): every option it shows is one the
  command's ``--help`` lists;
- **a GPU command** (``num_gpus_per_actor=``, ``train.device=cuda``): run where torch finds CUDA;
  elsewhere refused in one line, exit 2, nothing written;
- **run elsewhere**: the plug-in commands (tests/project/test_plugin_docs.py), the local
  multi-node block (run here as written, below), the ``make`` targets (CI runs ``make test-all``;
  here, that each target exists), and the cloud commands, which need an account (their files are
  validated in tests/project/test_cluster_configs.py; here, that each file they name exists).

A new command in the docs that fits none of these fails :func:`test_every_command_is_covered`.
A whole Python program of the docs (a ``python`` block that starts with an import) runs as
written on small copies of the job files it names.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import ROOT

FENCED = re.compile(r"```sh\n(.*?)```", re.S)
FMNIST = Path("/usr/share/datasets/fashion-mnist")
BIN = Path(sys.executable).parent
TINY = ["--set", "ray.backend=inprocess", "--set", "output.progress=none"]
SYNTH = ["--set", "algorithm.rounds=2", "--set", "data.clients=8", "--set", "algorithm.clients_per_round=4"]
STREAM = ["--set", "data.clients=4", "--set", "algorithm.cycles=1", "--set", "data.samples_min=20",
          "--set", "data.samples_max=30", "--set", "data.test_samples=40", "--set", "algorithm.eval_every=2",
          "--set", "algorithm.public_samples=100"]
IMAGES = ["--set", "algorithm.rounds=1", "--set", "data.clients=4", "--set", "algorithm.clients_per_round=2",
          "--set", "data.samples_min=20", "--set", "data.samples_max=30", "--set", "data.test_samples=40",
          "--set", "algorithm.eval_every=1"]

# the settings added to a command, by the script or config it runs (the first match)
SMALL: list[tuple[str, list[str]]] = [
    ("jobs/fedsoft_tables.py", ["--seeds", "0", *SYNTH, *TINY]),
    ("jobs/fpfc_table.py", ["--seeds", "0", "--methods", "fpfc", "local", "--rounds", "2", "--set", "data.clients=8",
                            "--set", "algorithm.clients_per_round=4", *TINY]),
    ("jobs/ccfl_pretraining.py", ["--uploads", "2", "--epochs", "1", *STREAM, *TINY]),
    ("jobs/ccfl_table1.py", ["--ks", "2", "--clients-per-cluster", "2", "--cycles", "1", "--public", "20",
                             "--set", "data.samples_min=20", "--set", "data.samples_max=30", *TINY]),
    ("jobs/ccfl_variants.py", [*STREAM, *TINY]),
    ("jobs/fedsoft_fmnist_sweep.py", ["--rounds", "1", "--eval-every", "1", *IMAGES[2:], *TINY]),
    ("jobs/batching_bench.py", ["--repeats", "1"]),
    ("ccfl_fmnist", [*STREAM, *TINY]),
    ("compare_fmnist", [*IMAGES, *TINY]),
    ("fedsoft_synthetic", [*SYNTH, "--set", "output.progress=none"]),
]
NEEDS_FMNIST = ("fmnist", "ccfl_")

SYNOPSIS = re.compile(r"\b(CONFIG|RUN_DIR|COMPARE_DIR|SWEEP)\b|\[")
MAKE = re.compile(r"^make (\S+)$")
CLOUD = ("ray up ", "ray rsync-down ", "ray dashboard ", "ray down ", "kubectl ", "RAY_AUTH_MODE=token RAY_AUTH_TOKEN")
LOCAL_CLUSTER = ("cluster_configs/local.sh", "--address 127.0.0.1:6390", "--address http://127.0.0.1:8265")
GPU = ("num_gpus_per_actor=", "train.device=cuda")  # commands that need a GPU (docs/running.md#on-gpus)


def commands(path: Path) -> list[str]:
    out = []
    for block in FENCED.findall(path.read_text()):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def _section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end > 0 else None]


PLUGIN_DOCS = {("docs/plugins.md", c) for c in commands(ROOT / "docs" / "plugins.md")}
PLUGIN_DOCS |= {("README.md", line.split("  #")[0].strip()) for block in
                FENCED.findall(_section(ROOT / "README.md", "## Bring your own method")) for line in block.splitlines()}
ALL = [(str(p.relative_to(ROOT)), c) for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
       for c in commands(p)]


def kind(doc: str, command: str) -> str:
    if (doc, command) in PLUGIN_DOCS:
        return "plugin"
    if MAKE.match(command):
        return "make"
    if command.startswith(CLOUD):
        return "cloud"
    if any(part in command for part in LOCAL_CLUSTER):
        return "local_cluster"
    if any(part in command for part in GPU) and command.startswith(("raysoft ", ".venv/bin/raysoft ")):
        return "gpu"
    if SYNOPSIS.search(command) and not command.startswith(".venv/bin/python jobs/"):
        return "synopsis"
    if command.startswith(("raysoft ", ".venv/bin/raysoft ", ".venv/bin/python jobs/")):
        return "run"
    return "unknown"


def test_every_command_is_covered():
    unknown = [f"{d}: {c}" for d, c in ALL if kind(d, c) == "unknown"]
    assert not unknown, "commands in the docs that no test runs:\n" + "\n".join(unknown)
    runs = [c for d, c in ALL if kind(d, c) in ("run", "gpu")]
    assert runs and all(any(key in c for key, _ in SMALL) for c in runs), [
        c for c in runs if not any(key in c for key, _ in SMALL)]


def _argv(command: str) -> list[str]:
    """The command as written, with the placeholders of an optional part dropped and this
    interpreter's virtualenv for .venv/bin."""
    command = re.sub(r"\s*\[[^\]]*\.\.\.\]", "", command)  # [--methods ...]: optional, left out
    argv = shlex.split(command)
    if argv[0].startswith(".venv/bin/"):
        argv[0] = str(BIN / argv[0][len(".venv/bin/"):])
    elif argv[0] == "raysoft":
        argv[0] = str(BIN / "raysoft")
    return argv


def _small(command: str) -> list[str]:
    return next(extra for key, extra in SMALL if key in command)


def _workdir(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "jobs", tmp_path / "jobs", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


RUNS = [(d, c) for d, c in ALL if kind(d, c) == "run"]


@pytest.mark.slow
@pytest.mark.parametrize("doc,command", RUNS, ids=[f"{d}: {c}"[:90] for d, c in RUNS])
def test_a_documented_command_runs(tmp_path, doc, command):
    if any(n in command for n in NEEDS_FMNIST) and not (FMNIST.is_dir() or os.environ.get("RAYSOFT_DATA")):
        pytest.skip("needs Fashion-MNIST (make data)")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    ran = subprocess.run([*_argv(command), *_small(command)], cwd=_workdir(tmp_path), env=env, capture_output=True,
                         text=True, timeout=1200)
    assert ran.returncode == 0, f"{doc}: {command}\n{ran.stderr[-3000:]}"
    assert list((tmp_path / "runs").rglob("*.parquet")) or "batching_bench" in command


GPU_RUNS = [(d, c) for d, c in ALL if kind(d, c) == "gpu"]


@pytest.mark.slow
@pytest.mark.parametrize("doc,command", GPU_RUNS, ids=[f"{d}: {c}"[:90] for d, c in GPU_RUNS])
def test_a_documented_gpu_command_runs_or_is_refused_in_one_line(tmp_path, doc, command):
    """Where torch finds CUDA the command runs; elsewhere (CI) it is refused before it starts:
    exit 2, one line naming the GPU setting it asks for, nothing written."""
    import torch

    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    ran = subprocess.run([*_argv(command), *_small(command)], cwd=_workdir(tmp_path), env=env, capture_output=True,
                         text=True, timeout=1200)
    if torch.cuda.is_available():
        assert ran.returncode == 0, f"{doc}: {command}\n{ran.stderr[-3000:]}"
        return
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    assert ran.returncode == 2 and len(lines) == 1, f"{doc}: {command}\n{ran.stderr[-3000:]}"
    assert "num_gpus_per_actor" in lines[0] or "train.device" in lines[0], lines[0]
    assert not list((tmp_path / "runs").rglob("*.parquet"))


def _help(argv: list[str]) -> str:
    sub = [a for a in argv[1:3] if not a.startswith("-") and a.isidentifier()][:1]
    return subprocess.run([str(BIN / "raysoft"), *sub, "--help"], capture_output=True, text=True, timeout=120,
                          check=True).stdout


SYNOPSES = [(d, c) for d, c in ALL if kind(d, c) == "synopsis"]


@pytest.mark.parametrize("doc,command", SYNOPSES, ids=[f"{d}: {c}"[:90] for d, c in SYNOPSES])
def test_a_synopsis_shows_only_options_the_command_has(doc, command):
    option = re.compile(r"(?<![\w-])(--[a-z][a-z-]*)")
    shown = set(option.findall(command))
    listed = set(option.findall(_help(shlex.split(command.replace("[", " ").replace("]", " ")))))
    assert shown <= listed, f"{doc}: {command}: not in --help: {sorted(shown - listed)}"


@pytest.mark.parametrize("doc,command", [(d, c) for d, c in ALL if kind(d, c) in ("make", "cloud")])
def test_make_targets_and_cloud_files_exist(doc, command):
    if MAKE.match(command):
        ran = subprocess.run(["make", "-n", MAKE.match(command).group(1)], cwd=ROOT, capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr
    else:
        for name in re.findall(r"cluster_configs/[\w.-]+", command):
            assert (ROOT / name).is_file(), f"{doc}: {command}: {name} does not exist"


@pytest.mark.slow
def test_the_local_cluster_block_runs_as_written(tmp_path):
    """docs/running.md's (and the README's) multi-node block on this machine, as written: start,
    join by the head's address, submit as a Ray Job, stop."""
    block = [c for d, c in ALL if d == "docs/running.md" and kind(d, c) == "local_cluster"]
    assert block[0] == "cluster_configs/local.sh start 2 1" and block[-1] == "cluster_configs/local.sh stop"
    readme = [c for d, c in ALL if d == "README.md" and kind(d, c) == "local_cluster"]
    assert readme == block, "the README shows the same block as docs/running.md"
    work = _workdir(tmp_path)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "RAY_AUTH_MODE": "token"}
    start, runs, stop = block[0], block[1:-1], block[-1]
    subprocess.run(["bash", "-c", start], cwd=ROOT, env=env, check=True, timeout=300, capture_output=True)
    try:
        for i, command in enumerate(runs):
            out = work / f"runs{i}"
            ran = subprocess.run([*_argv(command), *_small(command), "--set", "ray.placement_timeout_s=120",
                                  "--out", str(out)], cwd=work, env=env, capture_output=True, text=True, timeout=600)
            assert ran.returncode == 0, f"{command}\n{ran.stderr[-3000:]}"
            assert list(out.rglob("metrics.parquet")), command
    finally:
        subprocess.run(["bash", "-c", stop], cwd=ROOT, env=env, timeout=120, capture_output=True)


PYTHON_FENCED = re.compile(r"```python\n(.*?)```", re.S)
PROGRAMS = [(str(p.relative_to(ROOT)), block) for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
            for block in PYTHON_FENCED.findall(p.read_text()) if block.startswith("import ")]


@pytest.mark.slow
@pytest.mark.parametrize("doc,program", PROGRAMS, ids=[d for d, _ in PROGRAMS])
def test_a_documented_python_program_runs(tmp_path, doc, program):
    """A whole Python program of the docs (not an excerpt of a plug-in: those are the examples'
    code, run above), as written, on small versions of the job files it names."""
    import yaml

    from raysoft.config import load_raw

    work = _workdir(tmp_path)
    for name in set(re.findall(r"jobs/([\w.-]+\.yaml)", program)):
        raw = load_raw(ROOT / "jobs" / name, [a for a in _small(name) if a != "--set"])
        (work / "jobs" / name).write_text(yaml.safe_dump(raw))
    ran = subprocess.run([sys.executable, "-c", program], cwd=work, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, f"{doc}:\n{ran.stderr[-3000:]}"
    assert list((work / "runs").rglob("metrics.parquet"))
