"""The documentation describes the product as it is, and its links lead somewhere:

- README.md and every page of docs/ outside docs/studies/ (the studies, one page per question,
  keep their dates and references) and docs/results/ (generated, dated by its records) carry at
  most 3 dates (YYYY-MM-DD) and no issue number ("issue 31", "issues 39"): a user page is not
  a diary;
- every relative link of README.md and docs/**/*.md names a file of the repository, and a
  link to a #heading names a heading (or an ``<a id>``) of that page.
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


def test_the_checks_see_what_they_look_for(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A `title`: here\n\n## Two (2)\n\n```\n# not a heading [x](nowhere.md)\n```\n"
                    "[ok](#a-title-here) [ok2](#two-2) [bad](#three) [ext](https://x.org) `[code](no.md)`\n"
                    "issue 31 and 2026-01-02\n")
    assert anchors(page) == {"a-title-here", "two-2"}
    assert [t for _, t in links(page)] == ["#a-title-here", "#two-2", "#three"]
    assert ISSUE.findall(page.read_text()) == ["issue 31"] and DATE.findall(page.read_text()) == ["2026-01-02"]
