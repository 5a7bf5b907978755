"""The documentation as files: the README stays a front page, every relative link in README.md
and docs/*.md points at a file that exists (and at a heading that exists, for ``file.md#anchor``),
and no tracked file cites background material that is not part of the repository.

Pure file checks: nothing here imports raysoft.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from support.paths import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 250

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...

# Built from parts so that this file does not match its own check.
SPEC_NAME = "ALGORITHMS" + ".md"
PAPERS_PATH = re.compile(r"\b" + "papers" + r"/")


def prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, punctuation dropped
    (letters, digits, '_' and '-' kept), spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def links(path: Path) -> list[str]:
    """The targets of the Markdown links and images of a file (code excluded)."""
    out = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        out += LINK.findall(INLINE_CODE.sub("", line))
    return out


def test_slug_follows_github():
    """Headings become GitHub's anchors."""
    assert slug("CCFL loss scale") == "ccfl-loss-scale"
    assert slug("What a run writes") == "what-a-run-writes"
    assert slug("FedSoft, synthetic data (Table 1)") == "fedsoft-synthetic-data-table-1"
    assert slug("`ray.reduce_in_actors`: sums in the actors") == "rayreduce_in_actors-sums-in-the-actors"
    assert slug("From laptop to cluster") == "from-laptop-to-cluster"


def test_readme_is_a_front_page():
    """README.md stays short: the rest lives in docs/."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"


def test_docs_exist():
    """The documents the README points into."""
    names = {p.name for p in DOCS}
    assert {"algorithms.md", "architecture.md", "results.md", "performance.md", "running.md"} <= names


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(doc: Path):
    """Every relative link resolves to a file of the repository, and an anchor to a heading."""
    bad = []
    for target in links(doc):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, f"{doc.relative_to(ROOT)}: " + "; ".join(bad)


def tracked_text_files() -> list[Path]:
    """The repository's tracked files that are text (binary files and images skipped)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or path.suffix.lower() in (".png", ".jpg", ".jpeg", ".gif", ".pdf"):
            continue
        if b"\0" in path.read_bytes()[:8192]:
            continue
        files.append(path)
    return files


def test_no_citations_of_material_outside_the_repository():
    """Papers are cited by title and venue, and design choices by a docs/ anchor: no tracked file
    names the implementer's notes or the folder of papers beside them, which a clone does not have."""
    hits = []
    for path in tracked_text_files():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if SPEC_NAME in line or PAPERS_PATH.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}")
    assert not hits, f"{len(hits)} lines cite material outside the repository: " + ", ".join(hits[:20])
