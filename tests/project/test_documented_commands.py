"""Every shell command that README.md and docs/*.md show works as written.

A command is a line of a fenced ``sh`` block (continuation lines joined, comments dropped).
Each is one of:

- **run**: ``raysoft ...``, ``.venv/bin/raysoft ...`` and ``.venv/bin/python analysis/...``, run in a
  copy of ``jobs/`` and ``analysis/`` (so that nothing is written into the tree), in a fresh shell's environment,
  and must exit 0. The README's and docs/running.md's commands (a newcomer's first hour) run
  exactly as printed. The paper-scale commands of docs/results.md and docs/performance.md take
  hours as printed: they run with the small settings of :data:`SMALL` added (mostly ``--set``),
  so that what is checked is that each command, its options and the job files it names work;
  their full-size runs are the tables of those pages;
- **a synopsis** (``CONFIG``, ``RUN_DIR``, ``[--option ...]``): every option it shows is one the
  command's ``--help`` lists;
- **a GPU command** (``num_gpus_per_actor=``, ``train.device=cuda``): run as printed where torch
  finds CUDA; elsewhere refused in one line, exit 2, nothing written;
- **the local multi-node block** of docs/running.md (and the README): run as written, the
  commented ``or:`` alternatives too, from a folder laid out as a checkout
  (:func:`test_the_local_cluster_block_runs_as_written`);
- **make targets**: ``make run`` runs as written in a copy of the checkout that shares this
  virtualenv (:func:`test_make_run_runs_as_written`); ``make test-all`` is what CI runs
  (``.ci/run``), and ``make test`` its fast part; here, that each target exists;
- **run elsewhere**: the plug-in commands (tests/project/test_plugin_docs.py, as written) and the
  cloud commands, which need an account (their files are validated in
  tests/project/test_cluster_configs.py; here, that each file they name exists).

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
    ("analysis/fedsoft_synthetic_tables.py", ["--seeds", "0", *SYNTH, *TINY]),
    ("analysis/fpfc_table1.py", ["--seeds", "0", "--methods", "fpfc", "local", "--rounds", "2",
                                 "--set", "data.clients=8", "--set", "algorithm.clients_per_round=4", *TINY]),
    ("analysis/ccfl_pretraining_epochs.py", ["--uploads", "2", "--epochs", "1", *STREAM, *TINY]),
    ("analysis/ccfl_table1.py", ["--ks", "2", "--clients-per-cluster", "2", "--cycles", "1", "--public", "20",
                                 "--set", "data.samples_min=20", "--set", "data.samples_max=30", *TINY]),
    ("analysis/ccfl_staleness.py", [*STREAM, *TINY]),
    ("analysis/fedsoft_fmnist_sweep.py", ["--rounds", "1", "--eval-every", "1", *IMAGES[2:], *TINY]),
    ("analysis/batched_clients_speed.py", ["--repeats", "1"]),
    ("ccfl_fmnist", [*STREAM, *TINY]),
    ("compare_fmnist", [*IMAGES, *TINY]),
    ("fedsoft_synthetic", [*SYNTH, "--set", "output.progress=none"]),
    ("jobs/scenario_", ["--set", "algorithm.rounds=1", "--set", "algorithm.eval_every=1", "--set", "data.clients=8",
                        "--set", "algorithm.clients_per_round=4", "--set", "data.pool_samples=800",
                        "--set", "data.test_samples=40", *TINY]),
]
NEEDS_FMNIST = ("fmnist", "ccfl_", "scenario_")

SYNOPSIS = re.compile(r"\b(CONFIG|RUN_DIR|COMPARE_DIR|SWEEP)\b|\[")
MAKE = re.compile(r"^make (\S+)$")
CLOUD = ("ray up ", "ray rsync-down ", "ray dashboard ", "ray down ", "kubectl ", "RAY_AUTH_MODE=token RAY_AUTH_TOKEN")
LOCAL_CLUSTER = ("cluster_configs/local.sh", "--address 127.0.0.1:6390", "--address http://127.0.0.1:8265")
GPU = ("num_gpus_per_actor=", "train.device=cuda")  # commands that need a GPU (docs/running.md#on-gpus)
SCRIPT = ".venv/bin/python analysis/"  # the scripts behind the docs' tables
AS_PRINTED = ("README.md", "docs/running.md")  # the first hour's pages: their commands run exactly as printed


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
    if SYNOPSIS.search(command) and not command.startswith(SCRIPT):
        return "synopsis"
    if command.startswith(("raysoft ", ".venv/bin/raysoft ", SCRIPT)):
        return "run"
    return "unknown"


def test_every_command_is_covered():
    unknown = [f"{d}: {c}" for d, c in ALL if kind(d, c) == "unknown"]
    assert not unknown, "commands in the docs that no test runs:\n" + "\n".join(unknown)
    runs = [c for d, c in ALL if kind(d, c) in ("run", "gpu") and d not in AS_PRINTED]
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


def _small(doc: str, command: str) -> list[str]:
    """What is added to a documented command: nothing on the first hour's pages."""
    if doc in AS_PRINTED:
        return []
    return next(extra for key, extra in SMALL if key in command)


def _fresh_env() -> dict[str, str]:
    """A new shell's environment: the venv's bin first on PATH, none of the variables that other
    tests of this session set for themselves (token authentication as Ray's default leaves it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ENABLE_AUTO_CONNECT")}
    return {**env, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}


def _workdir(tmp_path: Path) -> Path:
    for folder in ("jobs", "analysis"):  # the analysis scripts read the job configs beside them
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


RUNS = [(d, c) for d, c in ALL if kind(d, c) == "run"]


@pytest.mark.slow
@pytest.mark.parametrize("doc,command", RUNS, ids=[f"{d}: {c}"[:90] for d, c in RUNS])
def test_a_documented_command_runs(tmp_path, doc, command):
    if any(n in command for n in NEEDS_FMNIST) and not (FMNIST.is_dir() or os.environ.get("RAYSOFT_DATA")):
        pytest.skip("needs Fashion-MNIST (make data)")
    ran = subprocess.run([*_argv(command), *_small(doc, command)], cwd=_workdir(tmp_path), env=_fresh_env(),
                         capture_output=True, text=True, timeout=1200)
    assert ran.returncode == 0, f"{doc}: {command}\n{ran.stderr[-3000:]}"
    assert list((tmp_path / "runs").rglob("*.parquet")) or "batched_clients_speed" in command


GPU_RUNS = [(d, c) for d, c in ALL if kind(d, c) == "gpu"]


@pytest.mark.slow
@pytest.mark.parametrize("doc,command", GPU_RUNS, ids=[f"{d}: {c}"[:90] for d, c in GPU_RUNS])
def test_a_documented_gpu_command_runs_or_is_refused_in_one_line(tmp_path, doc, command):
    """Where torch finds CUDA the command runs; elsewhere (CI) it is refused before it starts:
    exit 2, one line naming the GPU setting it asks for, nothing written."""
    import torch

    ran = subprocess.run([*_argv(command), *_small(doc, command)], cwd=_workdir(tmp_path), env=_fresh_env(),
                         capture_output=True, text=True, timeout=1200)
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


def _alternatives(path: Path, block_start: str) -> list[str]:
    """The commented ``#    or: ...`` alternatives of the block that starts with ``block_start``
    (their ``#`` continuation lines joined), as a user would paste them."""
    block = next(b for b in FENCED.findall(path.read_text()) if block_start in b)
    out: list[str] = []
    for line in block.splitlines():
        text = line.lstrip("#").strip()
        if line.startswith("#") and text.startswith("or: "):
            out.append(text[len("or: "):])
        elif line.startswith("#") and out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1] + " " + text
    return out


def _checkout_like(tmp_path: Path) -> Path:
    """A folder laid out as a checkout (jobs/, cluster_configs/, .gitignore, .venv): the docs'
    commands run from the checkout's top, and nothing they write lands in the tree."""
    work = _workdir(tmp_path)
    shutil.copy(ROOT / ".gitignore", work / ".gitignore")
    (work / "cluster_configs").symlink_to(ROOT / "cluster_configs")
    (work / ".venv").symlink_to(BIN.parent)
    return work


@pytest.mark.slow
def test_the_local_cluster_block_runs_as_written(tmp_path):
    """docs/running.md's (and the README's) multi-node block on this machine, as written, with its
    ``or:`` alternatives (jobs/submit.py, Ray's own ``ray job submit``): start, join by the head's
    address, submit as a Ray Job, stop. Each run lands in ./runs, as the docs say."""
    block = [c for d, c in ALL if d == "docs/running.md" and kind(d, c) == "local_cluster"]
    assert block[0] == "cluster_configs/local.sh start 2 1" and block[-1] == "cluster_configs/local.sh stop"
    readme = [c for d, c in ALL if d == "README.md" and kind(d, c) == "local_cluster"]
    assert readme == block, "the README shows the same block as docs/running.md"
    others = _alternatives(ROOT / "docs" / "running.md", block[0])
    assert [o.split()[0:2] for o in others] == [[".venv/bin/python", "jobs/submit.py"],
                                                ["RAY_AUTH_MODE=token", ".venv/bin/ray"]], others
    work = _checkout_like(tmp_path)
    start, runs, stop = block[0], [*block[1:-1], *others], block[-1]
    started = subprocess.run(["bash", "-c", start], cwd=work, env=_fresh_env(), timeout=300, capture_output=True,
                             text=True)
    assert started.returncode == 0, f"{start}\n{started.stdout[-1500:]}\n{started.stderr[-3000:]}"
    try:
        for command in runs:
            before = set((work / "runs").glob("*")) if (work / "runs").is_dir() else set()
            ran = subprocess.run(["bash", "-c", command], cwd=work, env=_fresh_env(), capture_output=True, text=True,
                                 timeout=900)
            assert ran.returncode == 0, f"{command}\n{ran.stdout[-1500:]}\n{ran.stderr[-3000:]}"
            new = set((work / "runs").glob("*")) - before
            assert len(new) == 1 and (new.pop() / "metrics.parquet").is_file(), command
    finally:
        subprocess.run(["bash", "-c", stop], cwd=work, env=_fresh_env(), timeout=120, capture_output=True)


@pytest.mark.slow
def test_make_run_runs_as_written(tmp_path):
    """The README's first command, ``make run``, in a copy of the checkout whose .venv is this
    one (installed, so make's install step has nothing to do): it runs the default job to the end
    and writes its run into the copy's ./runs."""
    work = tmp_path / "checkout"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, work / name)
    (work / ".venv").symlink_to(BIN.parent)
    env = {k: v for k, v in _fresh_env().items() if k not in ("PYTHON", "MAKEFLAGS", "MFLAGS")}
    if subprocess.run(["make", "-q", ".venv/.installed"], cwd=work, env=env, capture_output=True).returncode:
        pytest.skip("this virtualenv is not make's, or is older than pyproject.toml: make run would reinstall it")
    ran = subprocess.run(["make", "run"], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, f"make run\n{ran.stdout[-1500:]}\n{ran.stderr[-3000:]}"
    assert "pip install" not in ran.stdout, "make run reinstalled the package"
    made = list((work / "runs").glob("fedsoft-synthetic-*/metrics.parquet"))
    assert len(made) == 1 and made[0].parent.name in ran.stdout, ran.stdout[-1500:]


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
        raw = load_raw(ROOT / "jobs" / name, [a for a in _small(doc, name) if a != "--set"])
        (work / "jobs" / name).write_text(yaml.safe_dump(raw))
    ran = subprocess.run([sys.executable, "-c", program], cwd=work, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, f"{doc}:\n{ran.stderr[-3000:]}"
    assert list((work / "runs").rglob("metrics.parquet"))
