"""The documentation site: it builds with warnings as errors (broken links and anchors,
unknown names in the generated parts, config fields without a docstring), and every Python
example runs (its commands and YAML files are tests/test_examples.py's)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
TITLE = re.compile(r'title="([^"]+)"')


def fenced(path: Path, language: str) -> list[tuple[str | None, str]]:
    """``path``'s blocks in ``language``: (the file a block is titled as, or None; its text)."""
    found = []
    for lang, info, body in FENCE.findall(path.read_text()):
        if lang == language:
            title = TITLE.search(info)
            found.append((title.group(1) if title else None, body))
    return found


def blocks(path: Path, language: str) -> list[str]:
    return [body for _, body in fenced(path, language)]


@pytest.mark.extra("docs")
def test_site_builds_with_warnings_as_errors(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    warnings = [line for line in out.stderr.splitlines() if "WARNING" in line]
    assert out.returncode == 0 and not warnings, "\n".join(warnings) or out.stderr[-3000:]
    pages = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("index.html"))
    assert len(pages) == len(PAGES), pages  # every page of docs/ was built, no other
    config = (tmp_path / "config" / "index.html").read_text()
    assert "total_steps" in config and "Stop after this many environment steps" in config


PAGE_EXTRAS = {
    "algorithms/search.md": ("openspiel",),
    "tutorials/export.md": ("export",),
    "tutorials/offline.md": ("offline",),
}
"""The optional extras a page's Python examples need (they skip, naming it, without)."""


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(
            p, marks=pytest.mark.extra(*PAGE_EXTRAS.get(p.relative_to(DOCS).as_posix(), ()))
        )
        for p in PAGES
        if blocks(p, "python")
    ],
    ids=lambda p: p.relative_to(DOCS).as_posix(),
)
def test_python_examples_run(page, monkeypatch, tmp_path):
    """A page's Python blocks run in order in one namespace, in an empty directory; a block
    titled as a file (``title="my_envs.py"``) is written there instead, as the reader would."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace: dict = {"__name__": "__docs__"}
    for i, (title, body) in enumerate(fenced(page, "python")):
        if title is not None:
            (tmp_path / title).write_text(body)
            continue
        exec(compile(body, f"{page.name}, Python block {i + 1}", "exec"), namespace)
