"""Transfers and the cloud's critical path: what a large model costs on the data path.

Prints, on this machine:
- loopback: one TCP stream over 127.0.0.1 (Python sockets, `sendall` into `recv_into`), the yardstick; and
  the same bytes served by a bare Starlette route under uvicorn to httpx (the HTTP stack alone), with the
  services' stack (httptools on uvloop) and with uvicorn's pure-Python one (h11 on asyncio's loop);
- fetch: an edge's `GET /api/v1/edges/0/global` of a global state of `--megabytes` (an mlp sized to it on
  digits), through a cloud process and its private Redis (AOF on, `appendfsync always`, as deployed);
- submit: an edge's `POST …/contributions` of a contribution of `--megabytes` on the wire (zeros of the
  algorithm's wire spec: what an edge sends), until the 202; the cloud update it triggers is waited out
  before the next submit and not counted; beside it, a plain write of as many bytes to a file on the volume of
  the topology (Redis' own), fsynced, after each submit, which the submit is measured against (the median of
  the pairs' ratios), and a plain SET of as many bytes into the same Redis, the floor of a submit that makes
  the contribution durable there before answering; interleaved with them, the same submits to a second cloud
  whose blobs go to files on that volume (FL_CLOUD_BLOB_DIR), each against the write after it; each submit
  and each write starts once the update before it is evaluated and neither Redis rewrites its AOF (which
  each 60 MB update soon sets off);
- aggregation: `edge_aggregate` of 100 float32 updates of a 1.6M-parameter model (the CNN's size in the
  issue) against a plain copy of the same 100 updates into one buffer (bytes read per second), through the
  fused kernel (numba, `shared/core/algorithms/fused.py`) and through torch's ops alone;
- evaluation: the cloud's evaluation of the demo's CNN (MNIST 5k test set), and how long an edge waits
  from submitting the round's last contribution until the next version is served (`update latency`):
  with the evaluation on the critical path, it is in there.

    ./fl bench/transfers.py [--megabytes 60] [--repeats 5]

Each figure is the median of `--repeats` (loopback: the best, as a bound). Run with `nice`; on a shared
machine the spread is large, so read the ratios of one run together.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import redis
import torch

from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.algorithms import fused, registry
from fl_services.shared.core.algorithms.base import ClientResult
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.federation import evaluate_global, initial_model
from fl_services.shared.core.records import decode, encode
from fl_services.shared.core.reports import ClientParticipation, EdgeContributionHeader
from fl_services.shared.wire.edge_cloud import GlobalStateHeader
from fl_services.shared.wire.protocol import SAFETENSORS

ADMIN, EDGE = "bench-admin-token", "bench-edge-token"


def loopback_seconds(nbytes: int, repeats: int) -> float:
    """The best time of one TCP stream of `nbytes` over 127.0.0.1."""
    payload = bytes(nbytes)
    best = math.inf
    for _ in range(repeats):
        with socket.create_server(("127.0.0.1", 0)) as server:
            reader = threading.Thread(target=_receive, args=(server, bytearray(nbytes)))
            reader.start()
            with socket.create_connection(server.getsockname()) as sender:
                start = time.perf_counter()
                sender.sendall(payload)
                reader.join()
                best = min(best, time.perf_counter() - start)
    return best


def _receive(server: socket.socket, into: bytearray) -> None:
    conn, _ = server.accept()
    with conn:
        view, got = memoryview(into), 0
        while got < len(into):
            got += conn.recv_into(view[got:], len(into) - got)


def mlp_config(megabytes: float, bytes_per_parameter: int, **overrides: Any) -> RunConfig:
    """FedAvg on digits (64 features, 10 classes) with an mlp (h, h) of about `megabytes` of parameters."""
    parameters = megabytes * 1e6 / bytes_per_parameter
    h = int((-76 + math.sqrt(76**2 + 4 * (parameters - 10))) / 2)  # h² + 76h + 10 parameters
    return RunConfig(name="transfers", model={"name": "mlp", "hidden": (h, h)},
                     data={"dataset": "digits", "num_clients": 4}, rounds=1000, **overrides)


def wire_contribution(config: RunConfig, run_id: str, version: int) -> bytes:
    """What edge 0 would submit for client 0: zeros of the algorithm's wire spec."""
    algorithm = registry.create(config)
    global_ = algorithm.init_global(initial_model(config))
    spec = algorithm.contribution_spec(global_, [0])
    wire = getattr(algorithm, "wire_spec", lambda s: s)(spec)  # before float32 on the wire: the spec itself
    tensors = {g: {n: torch.zeros(shape, dtype=dtype) for n, (shape, dtype) in members.items()}
               for g, members in wire.items()}
    header = EdgeContributionHeader(run_id=run_id, edge_id=0, base_version=version, weight=100.0,
                                    idempotency_key=f"{run_id}:0:{version}",
                                    clients=[ClientParticipation(client_id=0, num_samples=100, loss=0.5)])
    return encode(tensors, header)


class Cloud:
    def __init__(self, url: str):
        self.http = httpx.Client(base_url=url, timeout=300)
        self.http.post("/api/v1/edges", json={"edge_id": 0}, headers=self._auth(EDGE)).raise_for_status()

    @staticmethod
    def _auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def start_run(self, config: RunConfig) -> str:
        r = self.http.post("/api/v1/runs", content=config.model_dump_json(),
                           headers={**self._auth(ADMIN), "Content-Type": "application/json"})
        r.raise_for_status()
        run_id = r.json()["run_id"]
        self.http.post(f"/api/v1/runs/{run_id}/start", headers=self._auth(ADMIN)).raise_for_status()
        return run_id

    def stop_run(self, run_id: str) -> None:
        self.http.post(f"/api/v1/runs/{run_id}/stop", headers=self._auth(ADMIN)).raise_for_status()

    def fetch(self, run_id: str, after: int = -1, timeout: float = 0) -> bytes:
        r = self.http.get("/api/v1/edges/0/global", headers=self._auth(EDGE),
                          params={"seen": f"{run_id}:{after}", "others": False, "timeout": timeout})
        r.raise_for_status()
        return r.content

    def submit(self, blob: bytes) -> None:
        r = self.http.post("/api/v1/edges/0/contributions", content=blob,
                           headers={**self._auth(EDGE), "Content-Type": SAFETENSORS})
        if r.status_code != 202:
            raise RuntimeError(f"submit answered {r.status_code}: {r.text[:300]}")

    def version(self, run_id: str) -> int:
        r = self.http.get(f"/api/v1/runs/{run_id}", headers=self._auth(ADMIN))
        r.raise_for_status()
        return int(r.json()["version"])

    def wait_evaluated(self, run_id: str, timeout_s: float = 300) -> None:
        """Until every record of the run's history has its evaluation (null until then)."""
        deadline = time.monotonic() + timeout_s
        while True:
            r = self.http.get(f"/api/v1/runs/{run_id}/history", headers=self._auth(ADMIN))
            r.raise_for_status()
            if not any(h["test_accuracy"] is None or math.isnan(float(h["test_accuracy"])) for h in r.json()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run_id}: a record stayed unevaluated")
            time.sleep(0.02)

    def wait_version(self, run_id: str, version: int, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while self.version(run_id) < version:
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run_id} did not reach version {version}")
            time.sleep(0.05)


def bytes_per_wire_parameter(config: RunConfig) -> int:
    algorithm = registry.create(config)
    small = {"model": {"w": torch.zeros(1)}}
    spec = getattr(algorithm, "wire_spec", lambda s: s)(algorithm.contribution_spec(small, [0]))
    return torch.empty(0, dtype=spec["model"]["w"][1]).element_size()


_BARE_SERVER = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
blob = bytes(int(sys.argv[1]))
async def serve(request):
    return Response(blob, media_type="application/octet-stream")
async def take(request):
    await request.body()
    return Response(status_code=202)
uvicorn.run(Starlette(routes=[Route("/blob", serve), Route("/blob", take, methods=["POST"])]), host="127.0.0.1",
            port=int(sys.argv[2]), log_level="warning", http=sys.argv[3], loop=sys.argv[4])
"""


# uvicorn's protocol and event loop: what the services serve with (shared/server/serve.py), and the pure-Python pair.
STACKS = {"httptools on uvloop": ("httptools", "uvloop"), "h11 on asyncio": ("h11", "asyncio")}


def bare_route_seconds(nbytes: int, repeats: int, stack: str) -> tuple[float, float, float | None]:
    """A GET of `nbytes` held in memory by a bare Starlette route under uvicorn's `stack` (of STACKS), read by
    httpx, and a POST of as many bytes from httpx that such a route reads whole: the same HTTP stack as a fetch and
    a submit, without the cloud (what bounds each from below); and the GET read by aiohttp, where installed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", _BARE_SERVER, str(nbytes), str(port), *STACKS[stack]])
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    http.get("/blob").raise_for_status()
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise
                    time.sleep(0.1)
            fetch = statistics.median(seconds(lambda: http.get("/blob").content) for _ in range(repeats))
            payload = bytes(nbytes)
            upload = statistics.median(seconds(lambda: http.post("/blob", content=payload).raise_for_status())
                                       for _ in range(repeats))
            return fetch, upload, aiohttp_get_seconds(f"http://127.0.0.1:{port}/blob", nbytes, repeats)
    finally:
        server.terminate()
        server.wait()


def aiohttp_get_seconds(url: str, nbytes: int, repeats: int) -> float | None:
    """A GET of `url` read whole by aiohttp on uvloop, None where aiohttp is not installed: an HTTP client that
    parses in C, against httpx's pure-Python h11, which is what a fetch of ours reads with."""
    try:
        import aiohttp
        import uvloop
    except ImportError:
        return None

    async def measure() -> float:
        async with aiohttp.ClientSession(read_bufsize=2**20) as session:
            async def get() -> float:
                start = time.perf_counter()
                async with session.get(url) as response:
                    assert len(await response.read()) == nbytes
                return time.perf_counter() - start
            await get()
            return statistics.median([await get() for _ in range(repeats)])

    return uvloop.run(measure())


def redis_set_seconds(url: str, nbytes: int, repeats: int) -> float:
    """A plain SET of `nbytes` into the topology's Redis (AOF, appendfsync always): the floor of any submit
    that stores the contribution there before it answers."""
    client = redis.Redis.from_url(url, socket_timeout=120)
    payload = bytes(nbytes)
    try:
        return statistics.median(seconds(lambda: client.set("bench:transfers", payload)) for _ in range(repeats))
    finally:
        client.delete("bench:transfers")
        client.close()


def fsynced_write_seconds(directory: str, nbytes: int, repeats: int) -> float:
    """A plain write of `nbytes` to a new file in `directory`, fsynced (the file's data and then the directory's
    entry): what any submit that makes the contribution durable on that volume costs at least."""
    payload = bytes(nbytes)
    path = os.path.join(directory, "bench-transfers.bin")

    def write() -> None:
        with open(path, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        entry = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(entry)
        finally:
            os.close(entry)

    try:
        return statistics.median(seconds(write) for _ in range(repeats))
    finally:
        os.unlink(path)


def transfers(cloud: Cloud, megabytes: float, repeats: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    # Fetch: a global state of `megabytes` (float32 parameters).
    config = mlp_config(megabytes, 4)
    run_id = cloud.start_run(config)
    blob = cloud.fetch(run_id)
    figures["fetch_mb"] = len(blob) / 1e6
    figures["fetch_s"] = statistics.median(seconds(lambda: cloud.fetch(run_id)) for _ in range(repeats))
    cloud.stop_run(run_id)
    return figures


def settled(redis_urls: list[str], timeout_s: float = 120) -> None:
    """Returns once no Redis of `redis_urls` rewrites its AOF in the background: each update appends a 60 MB
    global state to it, and the rewrites that follow would otherwise load the disk under whichever submit or
    write comes next, at random."""
    clients = [redis.Redis.from_url(url) for url in redis_urls]
    deadline = time.monotonic() + timeout_s
    try:
        while any(int(c.info("persistence")["aof_rewrite_in_progress"]) or
                  int(c.info("persistence")["aof_rewrite_scheduled"]) for c in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("an AOF rewrite did not end in time")
            time.sleep(0.05)
    finally:
        for c in clients:
            c.close()


def submits(clouds: list[Cloud], megabytes: float, repeats: int, directory: str,
            redis_urls: list[str]) -> tuple[int, list[tuple[float, float, float]]]:
    """A contribution of `megabytes` on the wire submitted `repeats` times to each cloud in turn (the update each
    triggers waited out, untimed), each submit followed by a plain fsynced write of as many bytes to a file in
    `directory`, both once the Redis of `redis_urls` rewrite no AOF: the contribution's size, and for each cloud
    the submit's median, the write's and the median of each submit over the write that followed it."""
    config = mlp_config(megabytes, bytes_per_wire_parameter(RunConfig()))
    run_ids = [cloud.start_run(config) for cloud in clouds]
    pairs: list[list[tuple[float, float]]] = [[] for _ in clouds]
    for version in range(repeats):
        turns = list(zip(clouds, run_ids, pairs, strict=True))
        for cloud, run_id, timed in turns[::-1] if version % 2 else turns:  # neither always after the other
            blob = wire_contribution(config, run_id, version)
            settled(redis_urls)
            submit = seconds(lambda: cloud.submit(blob))  # noqa: B023 (called at once)
            cloud.wait_version(run_id, version + 1)
            cloud.wait_evaluated(run_id)  # its evaluation runs after the update: not under the next write
            settled(redis_urls)
            timed.append((submit, fsynced_write_seconds(directory, len(blob), 1)))
    for cloud, run_id in zip(clouds, run_ids, strict=True):
        cloud.stop_run(run_id)
    return len(blob), [(statistics.median(s for s, _ in timed), statistics.median(w for _, w in timed),
                        statistics.median(s / w for s, w in timed)) for timed in pairs]


def seconds(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def update_latency(cloud: Cloud, repeats: int) -> float:
    """From the submit of a round's only contribution (B = 1) to the next version served to the edge:
    the cloud update with whatever of it lies on the critical path (the demo's CNN on MNIST 5k). Each
    submit waits until the previous version's record is evaluated, as a round whose clients train longer
    than an evaluation takes would (this run's rounds train nothing)."""
    config = RunConfig(name="latency", rounds=1000)
    run_id = cloud.start_run(config)
    times = []
    for version in range(repeats):
        cloud.wait_evaluated(run_id)
        blob = wire_contribution(config, run_id, version)
        start = time.perf_counter()
        cloud.submit(blob)
        served = cloud.fetch(run_id, after=version, timeout=60)
        times.append(time.perf_counter() - start)
        _, header = decode(served, GlobalStateHeader)
        if header.version != version + 1:
            raise RuntimeError(f"served version {header.version}, expected {version + 1}")
    cloud.stop_run(run_id)
    return statistics.median(times)


def evaluation_seconds(repeats: int) -> float:
    """The cloud's evaluation of the demo's CNN on the MNIST 5k test set (one torch thread)."""
    config = RunConfig(name="evaluation")
    algorithm = registry.create(config)
    global_ = algorithm.init_global(initial_model(config))
    evaluate_global(config, algorithm, global_, {})  # loads the data
    return statistics.median(seconds(lambda: evaluate_global(config, algorithm, global_, {})) for _ in range(repeats))


def aggregation(repeats: int, clients: int = 100) -> tuple[float, float, float]:
    """(edge_aggregate's GB/s, the same through torch's ops alone, a plain copy's GB/s) over `clients` float32
    updates of a 1.6M-parameter model, counted as the bytes of the updates read; the three interleaved."""
    shapes = {"conv1": (32, 1, 5, 5), "conv2": (64, 32, 5, 5), "fc1": (1024, 1500), "fc2": (10, 1024), "b": (1024,)}
    generator = torch.Generator().manual_seed(0)
    updates = [ClientResult(k, 100 + k, 0.5, {"model": {n: torch.randn(s, generator=generator)
                                                         for n, s in shapes.items()}})
               for k in range(clients)]
    read = sum(t.numel() * t.element_size() for u in updates for t in u.tensors["model"].values())
    algorithm = registry.create(RunConfig(name="aggregation"))
    into = {n: torch.empty(s) for n, s in shapes.items()}
    algorithm.edge_aggregate(updates, {}, 0)  # compiles the fused kernel (once per process), untimed
    aggregate_s, torch_s, copy_s = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        algorithm.edge_aggregate(updates, {}, 0)
        aggregate_s.append(time.perf_counter() - start)
        with mock.patch.object(fused, "kernels", lambda: None):  # torch's ops alone
            start = time.perf_counter()
            algorithm.edge_aggregate(updates, {}, 0)
            torch_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        for u in updates:
            for n, t in u.tensors["model"].items():
                into[n].copy_(t)
        copy_s.append(time.perf_counter() - start)
    return tuple(read / statistics.median(s) / 1e9 for s in (aggregate_s, torch_s, copy_s))  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)

    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    agg, agg_torch, copy = aggregation(args.repeats)
    kernel = "fused kernel" if fused.kernels() is not None else "torch's ops: numba is not installed"
    print(f"aggregation of 100 updates (1.6M parameters): {agg:.2f} GB/s ({kernel}); torch's ops alone "
          f"{agg_torch:.2f} GB/s; plain copy {copy:.2f} GB/s; ratio {agg / copy:.2f} "
          f"(torch's ops {agg_torch / copy:.2f})", flush=True)
    evaluation = evaluation_seconds(args.repeats)
    print(f"evaluation of the CNN (MNIST 5k test set): {evaluation * 1000:.0f} ms", flush=True)
    loopback = loopback_seconds(int(args.megabytes * 1e6), args.repeats)
    print(f"loopback TCP, {args.megabytes:g} MB: {loopback * 1000:.1f} ms ({args.megabytes / 1e3 / loopback:.2f} GB/s)",
          flush=True)
    bare_routes = {stack: bare_route_seconds(int(args.megabytes * 1e6), args.repeats, stack) for stack in STACKS}
    for stack, (bare, upload, by_aiohttp) in bare_routes.items():
        print(f"a bare uvicorn route ({stack}) serving {args.megabytes:g} MB to httpx: {bare * 1000:.0f} ms, "
              f"{bare / loopback:.1f}× loopback; reading as many POSTed by httpx: {upload * 1000:.0f} ms, "
              f"{upload / loopback:.1f}× loopback", flush=True)
        print(f"  the same GET read by aiohttp: {by_aiohttp * 1000:.0f} ms, {by_aiohttp / loopback:.1f}× loopback"
              if by_aiohttp is not None else "  (aiohttp is not installed: `pip install aiohttp` to compare a "
              "client that parses in C)", flush=True)
    env = {"FL_CLOUD_MAX_PAYLOAD_BYTES": str(4 * 2**30), "FL_CLOUD_LOG_LEVEL": "warning"}
    # Two topologies on one volume: blobs in Redis, and blobs in files there (FL_CLOUD_BLOB_DIR).
    workdir = Path(tempfile.mkdtemp(prefix="fl-bench-"))
    with LocalTopology(num_clients=0, num_edges=0, admin_token=ADMIN, edge_token=EDGE, extra_env=env) as topo,\
            LocalTopology(num_clients=0, num_edges=0, admin_token=ADMIN, edge_token=EDGE, workdir=workdir,
                          extra_env={**env, "FL_CLOUD_BLOB_DIR": str(workdir / "blobs")}) as in_files:
        cloud = Cloud(topo.cloud_url)
        latency = update_latency(cloud, args.repeats)
        print(f"update latency (submit → next version served), CNN: {latency * 1000:.0f} ms "
              f"(of which evaluation alone takes {evaluation * 1000:.0f} ms)", flush=True)
        f = transfers(cloud, args.megabytes, args.repeats)
        if topo.redis_url is None or in_files.redis_url is None:
            raise RuntimeError("the topology started no Redis")
        floor = redis_set_seconds(topo.redis_url, int(args.megabytes * 1e6), args.repeats)
        write_alone = fsynced_write_seconds(str(topo.workdir), int(args.megabytes * 1e6), args.repeats)
        nbytes, measured = submits([cloud, Cloud(in_files.cloud_url)], args.megabytes, args.repeats, str(workdir),
                                   [topo.redis_url, in_files.redis_url])
    shutil.rmtree(workdir, ignore_errors=True)
    loop_per_mb = loopback / (args.megabytes)
    print(f"fetch of a {f['fetch_mb']:.1f} MB global state: {f['fetch_s'] * 1000:.0f} ms, "
          f"{f['fetch_s'] / (loop_per_mb * f['fetch_mb']):.1f}× loopback")
    print(f"a plain SET of {args.megabytes:g} MB into this Redis (AOF, fsync always): {floor * 1000:.0f} ms, "
          f"{floor / loopback:.1f}× loopback, {floor / write_alone:.1f}× a plain fsynced write of as many bytes to "
          f"a file on this volume ({write_alone * 1000:.0f} ms, just after)")
    for where, (submit, write, ratio) in zip(["in Redis", "in a file on this volume (FL_CLOUD_BLOB_DIR)"],
                                             measured, strict=True):
        print(f"submit of a {nbytes / 1e6:.1f} MB contribution, its blob {where}: {submit * 1000:.0f} ms, "
              f"{submit / (loop_per_mb * nbytes / 1e6):.1f}× loopback; {ratio:.1f}× a plain fsynced write of the "
              f"same bytes to a file on this volume (median of the pairs; the writes' median {write * 1000:.0f} ms)")
    write = statistics.median(w for _, w, _ in measured)
    upload = bare_routes[next(iter(STACKS))][1]  # the services' stack
    print(f"  the HTTP stack alone (the bare route reading a POST of {args.megabytes:g} MB): {upload / write:.1f}× "
          f"the writes' median ({write * 1000:.0f} ms)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
