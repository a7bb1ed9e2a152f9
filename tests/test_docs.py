"""The documentation: the reference pages docs/generate.py writes from the code are the ones committed, every
relative link of README.md and docs/ leads to a file that exists, and docs/ builds as a static site offline
(mkdocs, strict: every anchor resolves) with every page in its navigation."""
from __future__ import annotations

import fnmatch
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Pages other branches add: linked already, so a link to one is not an error while it is missing. Once it
# exists this test fails until it is taken off the list, so the list cannot outlive its pages.
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
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {', '.join(broken)}"


def test_the_link_check_sees_links():
    # A pattern that matched nothing would pass every page: the README links into docs/ by kind.
    targets = relative_links(ROOT / "README.md")
    assert "docs/tutorial-first-run.md" in targets and "docs/ref-settings.md" in targets, targets


def nav_pages(entries) -> set[str]:
    pages: set[str] = set()
    for entry in entries:
        value = entry if isinstance(entry, str) else next(iter(entry.values()))
        pages |= {value} if isinstance(value, str) else nav_pages(value)
    return pages


def test_every_page_is_in_the_sites_navigation():
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert on_disk - nav == set(), "pages missing from mkdocs.yml's nav"
    assert nav - on_disk == set(), "mkdocs.yml's nav names pages that do not exist"


def test_the_site_builds_offline_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs (requirements-dev.txt) is not installed in this environment")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                            str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "tutorial-first-run" / "index.html").exists()


# `./fl WORD` as the docs give it in code (a fence, an inline span), and the benchmarks', the examples' and the
# compose files' usage lines (a line that starts with it, in a docstring or a comment): WORD must be one of ./fl's
# own commands, a script that exists, or a module the venv can run.
FL_COMMAND = re.compile(r"\./fl ([A-Za-z][\w./-]*)")
USAGE_LINE = re.compile(r"^[\s#$]*\./fl ([A-Za-z][\w./-]*)", re.MULTILINE)
INLINE = re.compile(r"`[^`\n]+`")


def fl_cases() -> list[list[str]]:
    """The patterns of ./fl's dispatch (`case "$cmd" in … esac`), in order, each case's alternatives."""
    script = (ROOT / "fl").read_text()
    body = script[script.index('case "$cmd" in'):]
    body = body[:body.index("\nesac")]
    return [label.split("|") for label in re.findall(r"^\s+([^\s#()][^\s()]*)\)", body, re.MULTILINE)]


def fl_words() -> dict[str, set[str]]:
    words: dict[str, set[str]] = {}
    sources = [*pages(), *(ROOT / "bench").glob("*.py"), *(ROOT / "examples").rglob("*.py"),
               *(ROOT / "docker").rglob("*.yml")]
    for path in sources:
        text = path.read_text()
        found = (FL_COMMAND.findall("\n".join([*FENCE.findall(text), *INLINE.findall(text)]))
                 if path.suffix == ".md" else USAGE_LINE.findall(text))
        for word in found:
            words.setdefault(word.rstrip("."), set()).add(str(path.relative_to(ROOT)))
    return words


def test_every_fl_command_the_docs_give_is_one_fl_runs():
    cases, words = fl_cases(), fl_words()
    assert ["demo"] in cases and ["*"] in cases and {"python", "demo", "fedctl"} <= set(words), (cases, sorted(words))
    wrong = []
    for word, where in sorted(words.items()):
        case = next(c for c in cases if any(fnmatch.fnmatchcase(word, pattern) for pattern in c))
        if case == ["*.py"]:
            ok = (ROOT / word).is_file()
        elif case == ["*"]:  # ./fl runs `python -m WORD`
            ok = importlib.util.find_spec(word.split(".")[0]) is not None
        else:
            ok = True
        if not ok:
            wrong.append(f"./fl {word} (in {', '.join(sorted(where))})")
    assert not wrong, "commands ./fl cannot run: " + "; ".join(wrong)
