"""The dashboard's pages: one layout (cloud/ui/pages/layout.html: the head, the bar on top, the main element)
around each page's own content (cloud/ui/pages/NAME.html), its title, styles and scripts."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from string import Template

PAGES_DIR = Path(__file__).resolve().parent / "pages"


@dataclass(frozen=True)
class Page:
    title: str
    styles: tuple[str, ...] = ()  # before app.css, which overrides them
    scripts: tuple[str, ...] = ()  # classic scripts (a vendor's global), run before the modules
    modules: tuple[str, ...] = ()


# By the file name each is served under (/ui/NAME; index.html at /ui/ too).
PAGES = {
    "index.html": Page("runs", modules=("js/runs.js",)),
    "run.html": Page("run", styles=("vendor/uplot/uPlot.min.css",), scripts=("vendor/uplot/uPlot.iife.min.js",),
                     modules=("js/run.js", "js/run-sites.js")),
    "topology.html": Page("topology", modules=("js/topology.js",)),
}


def render(name: str) -> str:
    """The page served as `name` (a key of PAGES), whole."""
    page = PAGES[name]
    head = [f'<link rel="stylesheet" href="{href}">' for href in (*page.styles, "app.css")]
    head += [f'<script src="{src}"></script>' for src in page.scripts]
    head += [f'<script type="module" src="{src}"></script>' for src in page.modules]
    main = (PAGES_DIR / name).read_text(encoding="utf-8")
    layout = Template((PAGES_DIR / "layout.html").read_text(encoding="utf-8"))
    return layout.substitute(title=page.title, head="\n".join(f"  {line}" for line in head),
                             main="".join(f"    {line}" if line.strip() else line
                                          for line in main.splitlines(keepends=True)).rstrip("\n"))
