"""The documentation: the reference pages docs/generate.py writes from the code are the ones committed, and
every relative link of README.md and docs/ leads to a file that exists."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Pages other branches add: linked already, so a link to one is not an error while it is missing. Once it
# exists this test fails until it is taken off the list, so the list cannot outlive its pages.
WRITTEN_ELSEWHERE = {DOCS / "how-to-storage-backend.md", DOCS / "decisions" / "lease-with-fencing.md"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def generator():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [target for target in LINK.findall(text)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]


def test_the_reference_pages_are_what_the_code_says():
    stale = [name for name, text in generator().pages().items()
             if not (DOCS / name).exists() or (DOCS / name).read_text() != text]
    assert not stale, f"stale: {', '.join(stale)}; run ./fl docs/generate.py and commit the pages"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file(page):
    broken = []
    for target in relative_links(page):
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists() and path not in WRITTEN_ELSEWHERE:
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {', '.join(broken)}"


def test_pages_written_elsewhere_are_still_missing():
    arrived = [str(p.relative_to(ROOT)) for p in WRITTEN_ELSEWHERE if p.exists()]
    assert not arrived, f"{', '.join(arrived)} exist now: take them off WRITTEN_ELSEWHERE in tests/test_docs.py"


def test_the_link_check_sees_links():
    # A pattern that matched nothing would pass every page: the README links into docs/ by kind.
    targets = relative_links(ROOT / "README.md")
    assert "docs/tutorial-first-run.md" in targets and "docs/ref-settings.md" in targets, targets
