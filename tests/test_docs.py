"""The documentation describes the product as it is, and its links lead somewhere:

- README.md and every page of docs/ outside docs/studies/ (the studies, one page per question,
  keep their dates and references) and docs/results/ (generated, dated by its records) carry at
  most 3 dates (YYYY-MM-DD) and no issue number ("issue 31", "issues 39"): a user page is not
  a diary;
- every relative link of README.md and docs/**/*.md names a file of the repository, and a
  link to a #heading names a heading (or an ``<a id>``) of that page;
- every Python file those pages name in this repository exists: ``engine/trees.py`` (from the
  root, from ``memforest_gpu/`` or from the page), and a bare ``name.py`` after a folder of its
  line (``store/`` (``memory_store.py``, ...), or ``engine/output.py`` ... ``report.py``: that
  folder, else ``memforest_gpu/``). A path whose first folder is not one of the repository's
  (another project's code) and placeholders (``scripts/NAME.py``) are not checked.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
USER_PAGES = [p for p in PAGES if not p.is_relative_to(DOCS / "studies") and not p.is_relative_to(DOCS / "results")]
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
ISSUE = re.compile(r"(?i)\bissues? \d+\b")
MAX_DATES = 3
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
ANCHOR_TAG = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
FENCE = re.compile(r"^\s*(```|~~~)")
#: pages another change is writing now: a link to one is checked once the page exists
PENDING = {"docs/studies/one-vector-per-node.md"}
PY_FILE = re.compile(r"(?<![\w./~-])((?:[\w.-]+/)*)([\w-]+\.py)(?![\w])")  # a folder path (maybe none), a file
FOLDER = re.compile(r"`((?:[\w.-]+/)+)`")  # a folder named alone: `store/`, `memforest_gpu/runs/`
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$")  # NAME in scripts/NAME.py


def prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation out (``-`` and ``_`` kept), spaces as ``-``."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for line in prose(page.read_text(encoding="utf-8")):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
        found.update(ANCHOR_TAG.findall(line))
    return found


def links(page: Path) -> list[tuple[int, str]]:
    out = []
    for i, line in enumerate(prose(page.read_text(encoding="utf-8")), 1):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                out.append((i, target))
    return out


def rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def missing_files(page: Path, root: Path = ROOT) -> list[str]:
    """The Python files of the repository that ``page`` names and that do not exist (module
    docstring), as ``line N: path``."""
    bad = []
    for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        context, named_folder = [], False  # the folders this line has named so far
        named = [*FOLDER.finditer(line), *PY_FILE.finditer(line)]
        for m in sorted(named, key=lambda m: m.start()):
            bases = [root, root / "memforest_gpu", page.parent, *context]
            if m.re is FOLDER:
                context += [b / m.group(1) for b in bases if (b / m.group(1)).is_dir()]
                named_folder = True
                continue
            folder, name = m.group(1), m.group(2)
            parts = [p for p in folder.split("/") if p] + [name[:-3]]
            if any(PLACEHOLDER.match(p) for p in parts) or (folder and not any((b / parts[0]).is_dir() for b in bases)):
                continue  # a placeholder, or another project's path
            if not folder and not context:
                continue  # a bare name with no folder on its line says nothing of where it is
            where = bases if folder else context + ([] if named_folder else [root / "memforest_gpu"])
            found = [b / folder / name for b in where if (b / folder / name).is_file()]
            if found:
                context.append(found[0].parent)
            else:
                bad.append(f"line {i}: {folder}{name}")
    return bad


@pytest.mark.parametrize("page", USER_PAGES, ids=rel)
def test_user_pages_are_not_diaries(page):
    text = page.read_text(encoding="utf-8")
    dates = DATE.findall(text)
    assert len(dates) <= MAX_DATES, f"{rel(page)} holds {len(dates)} dates (at most {MAX_DATES}): {dates}; " \
                                    "a dated measurement belongs to docs/studies/ or a record of docs/results/"
    issues = sorted({m.group(0) for m in ISSUE.finditer(text)})
    assert not issues, f"{rel(page)} names issue numbers {issues}: say what the product does instead"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_lead_to_a_file_and_a_heading(page):
    bad = []
    for line, target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if path and rel(dest) in PENDING and not dest.exists():
            continue
        if not dest.exists() or not dest.resolve().is_relative_to(ROOT):
            bad.append(f"line {line}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"line {line}: {target} (no heading #{anchor} in {rel(dest)})")
    assert not bad, f"{rel(page)}: " + "; ".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_the_python_files_a_page_names_exist(page):
    bad = missing_files(page)
    assert not bad, f"{rel(page)} names files that do not exist: " + "; ".join(bad)


def test_the_file_check_sees_a_missing_file(tmp_path):
    (tmp_path / "memforest_gpu" / "store").mkdir(parents=True)
    (tmp_path / "memforest_gpu" / "engine").mkdir()
    for f in ("store/io.py", "engine/trees.py", "report.py"):
        (tmp_path / "memforest_gpu" / f).write_text("")
    page = tmp_path / "p.md"
    page.write_text("`engine/trees.py` then `report.py`; `engine/quotas.py`\n"
                    "| `store/` | (`io.py`, `checks.py`) |\n"
                    "| `store/` | `report.py` |\n"
                    "`StreamMeCo/streammeco.py`, `scripts/NAME.py`, `setup.py` alone\n")
    assert missing_files(page, tmp_path) == ["line 1: engine/quotas.py", "line 2: checks.py", "line 3: report.py"]


def test_the_checks_see_what_they_look_for(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A `title`: here\n\n## Two (2)\n\n```\n# not a heading [x](nowhere.md)\n```\n"
                    "[ok](#a-title-here) [ok2](#two-2) [bad](#three) [ext](https://x.org) `[code](no.md)`\n"
                    "issue 31 and 2026-01-02\n")
    assert anchors(page) == {"a-title-here", "two-2"}
    assert [t for _, t in links(page)] == ["#a-title-here", "#two-2", "#three"]
    assert ISSUE.findall(page.read_text()) == ["issue 31"] and DATE.findall(page.read_text()) == ["2026-01-02"]
