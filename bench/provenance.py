"""Where the benchmark pages live, and the line at the top of each that says when, on what and by which
command its figures were measured: figures without it cannot be compared with later ones."""
from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
PREFIX = "> Measured "


def machine() -> str:
    """This machine in a few words: cores, CPU model, memory, and how loaded it is now."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        model = names[0] if names else model
    memory = ""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        total_kb = int(meminfo.read_text().split("MemTotal:", 1)[1].split()[0])
        memory = f", {total_kb / 2**20:.0f} GiB"
    load = f", load average {os.getloadavg()[0]:.1f} at the start" if hasattr(os, "getloadavg") else ""
    system = f"{platform.system()}, Python {platform.python_version()}"
    return f"{os.cpu_count()} CPU cores ({model}){memory}, {system}{load}"


def stamp() -> str:
    """This run's line: today's date, this machine, the command that was run."""
    command = shlex.join(["./fl", os.path.relpath(sys.argv[0], BENCHMARKS.parent.parent), *sys.argv[1:]])
    return f"{PREFIX}{datetime.date.today().isoformat()} on {machine()}, by `{command}`."


def earlier_stamp(page: Path) -> str:
    """The line a measuring run wrote on `page`, for a page rewritten from its stored figures (--render)."""
    if page.exists():
        for line in page.read_text().splitlines():
            if line.startswith(PREFIX):
                return line
    return f"{PREFIX}(unknown: the page was rendered from stored figures that carry no date)."


def stamped(text: str, line: str) -> str:
    """`text` with `line` under its title (or first, if it has none)."""
    if text.startswith("# "):
        title, _, rest = text.partition("\n")
        return f"{title}\n\n{line}\n{rest}"
    return f"{line}\n\n{text}"
