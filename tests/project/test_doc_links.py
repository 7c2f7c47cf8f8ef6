"""The documents' links and file names resolve, and no document or module speaks of work "stops".

Every Markdown link and image in README.md, BENCHMARKS.md and docs/ must name a file that exists
(relative to the document) and, with a ``#fragment``, a heading of that file, as GitHub spells its
anchors.  Every repository path written in code spans (``grammarspec/engine/step.py``, ``tools/...``)
must exist too, so a moved module cannot leave its old name behind in the docs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"(?<![\w./-])((?:grammarspec|grammars|proposers|tools|tests|examples|data|docs)/[\w./-]*\w)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(document: Path) -> set[str]:
    anchors: set[str] = set()
    fenced = False
    for line in document.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            slug = _slug(line.lstrip("#"))
            anchor, n = slug, 0
            while anchor in anchors:  # a repeated heading gets -1, -2, ...
                n += 1
                anchor = f"{slug}-{n}"
            anchors.add(anchor)
    return anchors


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(document: Path) -> None:
    broken = []
    for target in LINK.findall(document.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        file = (document.parent / path).resolve() if path else document
        if not file.exists():
            broken.append(target)
        elif fragment and file.suffix == ".md" and fragment not in _anchors(file):
            broken.append(target)
    assert not broken, f"{document.name}: links that do not resolve: {broken}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_in_code_spans_exists(document: Path) -> None:
    text = document.read_text()
    spans = CODE_SPAN.findall(text) + [block for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S)]
    missing = sorted(
        {path for span in spans for path in REPO_PATH.findall(span) if not (ROOT / path.split("::")[0]).exists()}
    )
    assert not missing, f"{document.name}: paths that do not exist: {missing}"


def test_no_document_or_module_numbers_work_stops() -> None:
    files = [*DOCUMENTS]
    for package in ("grammarspec", "grammars", "proposers", "tools", "tests", "examples"):
        files += sorted((ROOT / package).rglob("*.py"))
    stops = re.compile(r"\bstop \d+", re.IGNORECASE)
    found = [f"{f.relative_to(ROOT)}: {m.group()}" for f in files for m in stops.finditer(f.read_text())]
    assert not found, found
