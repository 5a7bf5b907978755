"""The commands that docs/plugins.md, the README's plug-in section and every example's README tell
a user to run work as written. A shell block (fenced ``sh``, or indented) is one script of its
lines that start with ``raysoft``, ``python`` or ``cd``, run as an activated virtualenv would
(the venv's bin first on PATH) in a copy of the repository's examples, so that no run is written
into the tree. An example's README runs from that example's folder; the others from the top."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import ROOT

FENCED = re.compile(r"```sh\n(.*?)```", re.S)
RUNNABLE = ("raysoft ", "python ", "cd ")
FMNIST = Path("/usr/share/datasets/fashion-mnist")


def _runnable(lines: list[str]) -> str:
    out = []
    for line in lines:
        line = line.split("  #")[0].strip()
        if line.startswith(RUNNABLE):
            out.append(line)
    return "\n".join(out)


def scripts(path: Path, section: str | None = None) -> list[str]:
    """The runnable scripts of ``path``'s shell blocks (of the section headed ``section``)."""
    text = path.read_text()
    if section is not None:
        start = text.index(section)
        end = text.find("\n## ", start + len(section))
        text = text[start:end if end > 0 else None]
    blocks = [block.splitlines() for block in FENCED.findall(text)]
    indented: list[str] = []
    for line in FENCED.sub("", text).splitlines() + [""]:
        if line.startswith("    ") and line.strip():
            indented.append(line)
        elif indented:
            blocks.append(indented)
            indented = []
    return [s for s in (_runnable(b) for b in blocks) if s]


DOCUMENTED = [("docs/plugins.md", ".", s) for s in scripts(ROOT / "docs" / "plugins.md")]
DOCUMENTED += [("README.md", ".", s) for s in scripts(ROOT / "README.md", "## Bring your own method")]
for readme in sorted((ROOT / "examples").glob("*/README.md")):
    DOCUMENTED += [(str(readme.relative_to(ROOT)),  # from the top when it says cd examples/...
                    "." if s.startswith("cd examples/") else str(readme.parent.relative_to(ROOT)), s)
                   for s in scripts(readme)]


def test_the_docs_and_every_example_have_commands():
    documents = {d for d, _, _ in DOCUMENTED}
    assert {"docs/plugins.md", "README.md"} <= documents
    assert len([d for d in documents if d.startswith("examples/")]) == len(list((ROOT / "examples").glob("*/")))


@pytest.mark.slow
@pytest.mark.parametrize("doc,where,script", DOCUMENTED, ids=[f"{d}: {s.splitlines()[-1]}"[:80]
                                                                for d, _, s in DOCUMENTED])
def test_a_documented_command_works_as_written(tmp_path, doc, where, script):
    if "fedasync" in where + script and not (FMNIST.is_dir() or os.environ.get("RAYSOFT_DATA")):
        pytest.skip("the FedAsync example runs on Fashion-MNIST, which is not installed here")
    shutil.copytree(ROOT / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("runs", "data", "__pycache__", "mlruns"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ran = subprocess.run(["bash", "-ec", script], cwd=tmp_path / where, env=env, capture_output=True, text=True,
                         timeout=1800)
    assert ran.returncode == 0, f"{doc}:\n{script}\n{ran.stderr[-2000:]}"
