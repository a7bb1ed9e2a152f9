"""Registration of many devices at one edge, through the real services.

A private redis-server, the cloud and one edge run as processes (fedctl's LocalTopology, no client processes).
This process plays N devices: each holds its own device token (issued for its id from the edges' client
secret, as `fedctl issue-token` does) and registers once with POST /api/v1/clients at the edge, declaring
labels (`region`, `family`) and a data summary (samples, input shape, label set, histogram), as `fl-client`
does for a device with its own data. Each registration opens its own connection (no keep-alive: devices are
separate hosts); `--concurrency` of them are in flight at once.

Measured per size: the total time of the N registrations, p50 and p99 of one registration, registrations/s;
the RSS of the edge and the cloud processes before and after (psutil); the size of the site's entry in the
cloud's GET /api/v1/sites (what the edge's site report carries: its devices per state, the first 50 of them,
its runs) after the N; and the time until that entry counts N devices, from the first registration and from
the last one's answer (the edge reports every `--report-s` seconds, its site_report_s setting, and soon after
a device registers).

    ./fl bench/registration.py [--sizes 100 1000] [--concurrency 32] [--report-s 10] [--out docs/benchmarks]
    ./fl bench/registration.py --out docs/benchmarks --render
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
from provenance import earlier_stamp, stamp, stamped

from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.wire.protocol import issue_device_tokens

REGIONS = ("eu", "us", "apac")


def registration(client_id: int, rng: np.random.Generator) -> dict:
    """What a device with its own MNIST-like data declares: labels and a summary computed locally."""
    samples = int(rng.integers(50, 600))
    histogram = np.bincount(rng.integers(0, 10, samples), minlength=10)
    return {"client_id": client_id, "num_samples": samples,
            "capabilities": {"device": "cpu", "torch_threads": 1},
            "labels": {"region": REGIONS[client_id % len(REGIONS)], "family": "cnn"},
            "summary": {"samples": samples, "held_out_samples": samples // 5, "input_shape": [1, 28, 28],
                        "labels": [d for d in range(10) if histogram[d]],
                        "histogram": {str(d): int(c) for d, c in enumerate(histogram) if c}}}


async def register_all(url: str, tokens: dict[int, str], bodies: dict[int, dict], concurrency: int) -> list[float]:
    """Every device's registration, `concurrency` at once; each one's seconds. A refusal ends the benchmark."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as http:
        async def one(k: int) -> float:
            async with gate:
                start = time.perf_counter()
                response = await http.post("/api/v1/clients", json=bodies[k],
                                           headers={"Authorization": f"Bearer {tokens[k]}"})
                took = time.perf_counter() - start
            if response.status_code != 200:
                raise RuntimeError(f"device {k}: {response.status_code} {response.text[:200]}")
            return took
        return list(await asyncio.gather(*(one(k) for k in tokens)))


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def site_entry(url: str, token: str) -> dict | None:
    sites = httpx.get(f"{url}/api/v1/sites", headers={"Authorization": f"Bearer {token}"}, timeout=10.0)
    sites.raise_for_status()
    return sites.json()[0] if sites.json() else None


def measure(size: int, concurrency: int, report_s: float, workdir: Path) -> dict:
    rng = np.random.default_rng(size)
    first_id = 1_000_000  # any token-bound ids, not 0 … N−1
    ids = [first_id + 7 * k for k in range(size)]
    bodies = {k: registration(k, rng) for k in ids}
    env = {"FL_EDGE_SITE_REPORT_S": str(report_s)}
    with LocalTopology(num_clients=0, num_edges=1, workdir=workdir / f"n{size}", extra_env=env) as topo:
        tokens = issue_device_tokens(topo.client_token, ids)
        edge, cloud = topo.edges[0], topo.cloud
        assert edge.proc is not None and cloud is not None and cloud.proc is not None
        before = {"edge": rss_mib(edge.proc.pid), "cloud": rss_mib(cloud.proc.pid)}
        load = os.getloadavg()[0]
        start = time.perf_counter()
        times = asyncio.run(register_all(edge.address(), tokens, bodies, concurrency))
        done = time.perf_counter()
        total = done - start
        while True:  # until the cloud's site registry counts them all
            entry = site_entry(topo.cloud_url, topo.admin_token)
            if entry is not None and entry.get("devices") == size:
                break
            if time.perf_counter() - done > 6 * report_s + 30:
                raise RuntimeError(f"the cloud's site registry shows {entry and entry.get('devices')} devices")
            time.sleep(0.1)
        seen = time.perf_counter()
        after = {"edge": rss_mib(edge.proc.pid), "cloud": rss_mib(cloud.proc.pid)}
    ordered = sorted(times)
    return {"devices": size, "concurrency": concurrency, "load": load, "total_s": total,
            "p50_ms": 1000 * statistics.median(ordered), "p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))],
            "per_s": size / total, "edge_rss_mib": [before["edge"], after["edge"]],
            "cloud_rss_mib": [before["cloud"], after["cloud"]],
            "site_entry_bytes": len(json.dumps(entry, separators=(",", ":")).encode()),
            "page_devices": len(entry.get("device_page", [])),
            "seen_from_first_s": seen - start, "seen_from_last_s": seen - done, "report_s": report_s}


def table(rows: list[dict]) -> str:
    lines = ["| devices | load | total s | p50 ms | p99 ms | registrations/s | edge RSS MiB before → after "
             "| cloud RSS MiB before → after | site entry bytes (devices listed) | cloud shows all: s after first "
             "/ after last |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['devices']:,} | {r['load']:.1f} | {r['total_s']:.2f} | {r['p50_ms']:.1f} | "
                     f"{r['p99_ms']:.1f} | {r['per_s']:.0f} | {r['edge_rss_mib'][0]:.1f} → {r['edge_rss_mib'][1]:.1f} "
                     f"| {r['cloud_rss_mib'][0]:.1f} → {r['cloud_rss_mib'][1]:.1f} | {r['site_entry_bytes']:,} "
                     f"({r['page_devices']}) | {r['seen_from_first_s']:.1f} / {r['seen_from_last_s']:.1f} |")
    return "\n".join(lines)


def document(rows: list[dict], line: str) -> str:
    method = (__doc__ or "").split("\n\n    ./fl")[0].partition("\n\n")[2].strip()
    return stamped(f"""# Registration of many devices at one edge

{method}

Concurrency {rows[0]['concurrency']}; the edge's site report every {rows[0]['report_s']:g} s; "load" is the
1-minute load average when the registrations started. The devices' side (this process) shares the 2 cores
with the edge, the cloud and Redis.

{table(rows)}

Reading: the cloud's view lags the edge's by about a second (the "after last" column), whatever the number of
devices and however long the report interval: a device that registers is reported within a tenth of the
interval, a second at most, one report for a burst of them. The site entry stays the same size from 100 to
1,000 devices because a report lists at most 50 of them and counts the rest per state. The edge's RSS grows by
what it keeps of each device (its registration, with its data summary, and its registry entries).
""", line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--report-s", type=float, default=10.0)
    parser.add_argument("--out", type=Path, help="write registration.md and registration.json there")
    parser.add_argument("--render", action="store_true", help="rewrite --out's page from its registration.json")
    args = parser.parse_args()
    if args.render and args.out:
        page = args.out / "registration.md"
        page.write_text(document(json.loads((args.out / "registration.json").read_text()), earlier_stamp(page)))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="fl-registration-") as tmp:
        for size in args.sizes:
            print(f"{size} devices: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
            rows.append(measure(size, args.concurrency, args.report_s, Path(tmp)))
    print(table(rows))
    print(f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "registration.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / "registration.md").write_text(document(rows, stamp()))


if __name__ == "__main__":
    main()
