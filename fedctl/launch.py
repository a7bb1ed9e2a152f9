"""Starts the whole topology on this machine as separate processes: a private Redis, the cloud,
L edges and client processes hosting logical clients. `fedctl demo`, `fedctl up`, the integration tests and
bench/ use it; docker-compose.yml describes the same topology for a Docker engine.

Each service runs in a process session of its own (a Ctrl-C in the terminal reaches fedctl, not them), so
whoever starts a topology stops it: `with LocalTopology(...)` does, also when SIGTERM or SIGHUP ends the
process inside `stop_on_signals()`. The topology records its processes in `workdir/topology.json`, from
which `stop_recorded` stops them from another process (`fedctl down`)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fl_services.fedctl.certs import write_deployment
from fl_services.fedctl.redis_server import RedisServer, free_port
from fl_services.fedctl.warm import WarmProcess, can_start_warm, process_start_time
from fl_services.shared.runtime.files import write_private
from fl_services.shared.wire.admin import EdgeHealth
from fl_services.shared.wire.protocol import issue_device_tokens, tokens_file_text
from fl_services.shared.wire.tls import client_context

ROOT = Path(__file__).resolve().parent.parent


def split(ids: list[int], parts: int) -> list[list[int]]:
    parts = max(1, min(parts, len(ids)))
    return [ids[i::parts] for i in range(parts)]


def ids_spec(ids: list[int]) -> str:
    return ",".join(str(i) for i in ids)


def listens(pid: int, port: int) -> bool | None:
    """Whether process `pid` holds a TCP socket listening on `port`, read from /proc (the tables of its own network
    namespace, so a process under `ip netns exec` too); None where /proc has no such tables (not Linux)."""
    if not Path("/proc/self/net/tcp").exists():
        return None
    proc = Path(f"/proc/{pid}")
    sockets: set[str] = set()
    try:
        for table in ("tcp", "tcp6"):
            for line in (proc / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()  # sl, local address:port (hex), remote, state (0A: LISTEN), ..., [9] inode
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    sockets.add(f"socket:[{fields[9]}]")
        return any(os.readlink(fd) in sockets for fd in (proc / "fd").iterdir())
    except (FileNotFoundError, ProcessLookupError, PermissionError):  # the process (or one of its files) is gone
        return False


@dataclass
class Service:
    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    url: str | None = None
    # Runs the process through this command, e.g. ["ip", "netns", "exec", "host2"] for another host.
    prefix: list[str] = field(default_factory=list)
    # Another program than this interpreter (args follow it), e.g. an installed console script such as
    # fl-client; it runs from the log's directory, outside any checkout, so it imports its own installation.
    program: list[str] | None = None
    # How a probe of an https:// service verifies it and which certificate it presents.
    tls: ssl.SSLContext | None = None
    # A plain `python -m` process even where a warm start (fl_services.fedctl.warm) would do.
    cold: bool = False
    proc: subprocess.Popen[bytes] | WarmProcess | None = None

    def start(self) -> None:
        # `python -m` searches its working directory first: from ROOT the services run the very code this
        # module was loaded from, a checkout (whatever else the venv holds) or the installed package.
        self._log = open(self.log, "ab")
        env = {**os.environ, **self.env}
        if not (self.cold or self.program or self.prefix) and can_start_warm(self.args, env):
            self.proc = WarmProcess(self.args, env, ROOT, self.log)
            return
        command, cwd = (self.program, self.log.parent) if self.program else ([sys.executable], ROOT)
        self.proc = subprocess.Popen([*self.prefix, *command, *self.args], cwd=cwd, env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")
            try:
                # A 200 counts once this process holds the port: until it binds, another service that took the
                # port (had it not been reserved for us) would answer in its place.
                if self.health().status_code == 200 and self._listening() is not False:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not healthy after {timeout}s:\n{self.log_tail()}")

    def _listening(self) -> bool | None:
        """Whether this service's process listens on its URL's port; None where /proc cannot tell (not Linux)."""
        if self.proc is None:
            return False
        port = httpx.URL(self.address()).port
        return listens(self.proc.pid, port) if port is not None else None

    def health(self) -> httpx.Response:
        return httpx.get(f"{self.address()}/health", timeout=2.0, verify=self.tls or client_context())

    def address(self) -> str:
        """Where the service answers HTTP (a client process answers none)."""
        if self.url is None:
            raise ValueError(f"{self.name} serves no HTTP")
        return self.url

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""


@dataclass
class LocalTopology:
    """Cloud + `num_edges` edges + clients 0..num_clients-1, `procs_per_edge` client processes per edge.

    Client k's process is started at edge k mod L: the simulated federation's binding (RunConfig.clients_of_edge),
    which the reference runner replays. It is this launcher's choice: a device is a member of the edge it registers
    at, which a run with a selection takes as it finds it.
    """

    num_clients: int = 10
    num_edges: int = 1
    procs_per_edge: int = 2
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fl-")))
    redis_url: str | None = None
    torch_threads: int = 1
    admin_token: str = "dev-admin-token"
    edge_token: str = "dev-edge-token"
    client_token: str = "dev-client-token"
    key_prefix: str = field(default_factory=lambda: f"fl{os.getpid()}x{time.monotonic_ns() % 10**6}")
    extra_env: dict[str, str] = field(default_factory=dict)
    # Per-edge settings on top of extra_env, e.g. {2: {"FL_EDGE_SLOWDOWN": "3"}} for one slow edge.
    edge_env: dict[int, dict[str, str]] = field(default_factory=dict)
    # Where edges listen and clients reach them, and how client processes start: clients on another
    # host (a network namespace) need an edge address routed there and ["ip", "netns", "exec", name].
    edge_host: str = "127.0.0.1"
    client_prefix: list[str] = field(default_factory=list)
    # Client processes, by their start order, run by another program than `fl-client`, e.g.
    # {0: ["/elsewhere/bin/fl-client"]} for a wheel installed in another venv.
    client_programs: dict[int, list[str]] = field(default_factory=dict)
    # Per client process (by start order) settings on top of extra_env, e.g. {0: {"FL_CLIENT_DATA":
    # "npz:/data/site.npz"}} for a device training on its own data.
    client_env: dict[int, dict[str, str]] = field(default_factory=dict)
    # Cloud replicas over the one Redis; with more than one, `cloud_front` is given their addresses and
    # returns the one address edges and operators use (a load balancer it started), else the first's.
    cloud_replicas: int = 1
    cloud_front: Callable[[list[str]], str] | None = None
    # Every HTTP hop over HTTPS, with the certificates of `fedctl certs` made in workdir/certs; with
    # mutual_tls, the cloud and the edges also require a certificate of that CA from every caller.
    tls: bool = False
    mutual_tls: bool = False
    # The services' log level (their logs are workdir/<name>.log).
    log_level: str = "warning"
    # Where the cloud and the edges listen: 0 picks a free port; edge l listens on edge_port + l.
    cloud_port: int = 0
    edge_port: int = 0
    # Each client process holds a device token per logical client it hosts (`fedctl issue-token --out`, its
    # client_tokens setting), not the edges' client secret, as the compose TLS variant's containers do.
    device_tokens: bool = False
    # Every service as a plain `python -m` process (as FL_LAUNCH_COLD=1 asks), not forked warm from a
    # forkserver that imported the service modules once (fl_services.fedctl.warm).
    cold: bool = False

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.redis: RedisServer | None = None
        self.cloud: Service | None = None
        self.clouds: list[Service] = []
        self.front_url: str | None = None
        self.edges: list[Service] = []
        self.clients: list[Service] = []
        # With device_tokens: each logical client's token (its id, to revoke it, is the token's third part).
        self.tokens: dict[int, str] = {}
        # What the state file holds besides the processes and URLs (e.g. `fedctl up`'s settings).
        self.notes: dict[str, Any] = {}

    @property
    def cloud_url(self) -> str:
        return self.front_url or self._cloud().address()

    @property
    def scheme(self) -> str:
        return "https" if self.tls or self.mutual_tls else "http"

    @property
    def certs(self) -> Path:
        """Where `fedctl certs` put the CA and the certificates (TLS only)."""
        return self.workdir / "certs"

    def client_tls(self) -> ssl.SSLContext | None:
        """What an operator's client (fedctl, a probe) of this topology verifies with and presents (as
        admin.pem); None over plain HTTP."""
        if self.scheme == "http":
            return None
        return client_context(self.certs / "ca.pem", *self._cert("admin")) if self.mutual_tls else\
            client_context(self.certs / "ca.pem")

    def _cert(self, name: str) -> tuple[Path, Path]:
        return self.certs / f"{name}.pem", self.certs / f"{name}.key"

    def _tls_env(self, prefix: str, name: str) -> dict[str, str]:
        """The settings with which service `name` (cloud, edge<i>) serves HTTPS, and requires client
        certificates under mutual TLS."""
        if self.scheme == "http":
            return {}
        cert, key = self._cert(name)
        env = {f"{prefix}TLS_CERT_FILE": str(cert), f"{prefix}TLS_KEY_FILE": str(key)}
        if self.mutual_tls:
            env[f"{prefix}TLS_CLIENT_CA_FILE"] = str(self.certs / "ca.pem")
        return env

    def _redis_tls_env(self) -> dict[str, str]:
        """The cloud's settings for its own Redis over TLS: the CA, and cloud.pem as its client certificate."""
        if self.redis is None or self.redis.tls_dir is None:
            return {}
        cert, key = self._cert("cloud")
        return {"FL_CLOUD_REDIS_CA_FILE": str(self.certs / "ca.pem"), "FL_CLOUD_REDIS_CERT_FILE": str(cert),
                "FL_CLOUD_REDIS_KEY_FILE": str(key)}

    def _dial_env(self, prefix: str, peer: str, name: str) -> dict[str, str]:
        """The settings with which `name` (edge<i>, client<k>) verifies its `peer` (cloud, edge) and presents
        its own certificate under mutual TLS."""
        if self.scheme == "http":
            return {}
        env = {f"{prefix}{peer}_CA_FILE": str(self.certs / "ca.pem")}
        if self.mutual_tls:
            cert, key = self._cert(name)
            env |= {f"{prefix}{peer}_CERT_FILE": str(cert), f"{prefix}{peer}_KEY_FILE": str(key)}
        return env

    def _token_env(self, ids: list[int], name: str) -> dict[str, str]:
        """How a client process hosting `ids` authenticates: with the client secret, or (device_tokens) with a
        file of tokens issued for those clients, kept beside the process's log."""
        if not self.device_tokens:
            return {"FL_CLIENT_CLIENT_TOKEN": self.client_token}
        issued = issue_device_tokens(self.client_token, ids)
        self.tokens |= issued
        path = self.workdir / f"{name}.tokens"
        write_private(path, tokens_file_text(issued).encode())
        return {"FL_CLIENT_CLIENT_TOKENS_FILE": str(path)}

    def _cloud(self) -> Service:
        if self.cloud is None:
            raise RuntimeError("the topology is not started")
        return self.cloud

    def _cloud_service(self, port: int, replica: int = 0) -> Service:
        if self.redis_url is None:
            raise RuntimeError("the cloud needs Redis: start() starts one when no redis_url is given")
        name = "cloud" if replica == 0 else f"cloud{replica}"
        return Service(name, ["-m", "fl_services.cloud.main"], {
            "FL_CLOUD_PORT": str(port), "FL_CLOUD_REDIS_URL": self.redis_url,
            "FL_CLOUD_KEY_PREFIX": self.key_prefix, "FL_CLOUD_ADMIN_TOKEN": self.admin_token,
            "FL_CLOUD_EDGE_TOKEN": self.edge_token, "FL_CLOUD_TORCH_THREADS": str(self.torch_threads),
            "FL_CLOUD_LOG_LEVEL": self.log_level, "FL_CLOUD_REPLICA_ID": name, **self._tls_env("FL_CLOUD_", "cloud"),
            **self._redis_tls_env(), **self.extra_env,
        }, self.workdir / f"{name}.log", url=f"{self.scheme}://127.0.0.1:{port}", tls=self.client_tls(),
            cold=self.cold)

    def start(self) -> "LocalTopology":
        """Starts every process and waits until the services answer and the clients are registered; whatever
        ends the start (an error, a signal turned KeyboardInterrupt) stops what it had started."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        if self.scheme == "https":
            write_deployment(self.certs, edges=self.num_edges, clients=self.num_edges * self.procs_per_edge,
                             hosts=[self.edge_host], days=2)
        if self.redis_url is None:  # its own Redis, over TLS too when the topology is
            self.redis = RedisServer(dir=self.workdir / "redis",
                                     tls_dir=self.certs if self.scheme == "https" else None).start()
            self.redis_url = self.redis.url
            self.record()
        self.clouds = [self._cloud_service(self.cloud_port + k if self.cloud_port else free_port(), k)
                       for k in range(self.cloud_replicas)]
        for cloud in self.clouds:
            cloud.start()
            self.record()
        self.cloud = self.clouds[0]
        if self.cloud_front is not None:
            # The front only once every replica answers: a balancer that finds its upstreams refusing marks
            # them down (nginx: for fail_timeout), and answered 502 to the run's creation seconds later.
            self._ready(self.clouds)
            self.front_url = self.cloud_front([c.address() for c in self.clouds])
        for edge_id in range(self.num_edges):
            port = self.edge_port + edge_id if self.edge_port else free_port()
            edge = Service(f"edge{edge_id}", ["-m", "fl_services.edge.main"], {
                "FL_EDGE_EDGE_ID": str(edge_id), "FL_EDGE_HOST": self.edge_host, "FL_EDGE_PORT": str(port),
                "FL_EDGE_CLOUD_URL": self.cloud_url,
                "FL_EDGE_EDGE_TOKEN": self.edge_token, "FL_EDGE_CLIENT_TOKEN": self.client_token,
                "FL_EDGE_TORCH_THREADS": str(self.torch_threads), "FL_EDGE_LOG_LEVEL": self.log_level,
                "FL_EDGE_STATE_DIR": str(self.workdir / "edge-state"), **self._tls_env("FL_EDGE_", f"edge{edge_id}"),
                **self._dial_env("FL_EDGE_", "CLOUD", f"edge{edge_id}"), **self.extra_env,
                **self.edge_env.get(edge_id, {}),
            }, self.workdir / f"edge{edge_id}.log", url=f"{self.scheme}://{self.edge_host}:{port}",
                tls=self.client_tls(), cold=self.cold)
            self.edges.append(edge)
            edge.start()
            self.record()
        for edge_id, edge in enumerate(self.edges):
            edge_clients = list(range(edge_id, self.num_clients, self.num_edges))
            for p, ids in enumerate(split(edge_clients, self.procs_per_edge) if edge_clients else []):
                program = self.client_programs.get(len(self.clients))
                client = Service(f"client{edge_id}.{p}", [] if program else ["-m", "fl_services.client.main"], {
                    "FL_CLIENT_EDGE_URL": edge.address(), "FL_CLIENT_CLIENTS": ids_spec(ids),
                    **self._token_env(ids, f"client{edge_id}.{p}"), "FL_CLIENT_TORCH_THREADS": str(self.torch_threads),
                    "FL_CLIENT_STATE_DIR": str(self.workdir / "client-state"), "FL_CLIENT_LOG_LEVEL": self.log_level,
                    **self._dial_env("FL_CLIENT_", "EDGE", f"client{len(self.clients)}"), **self.extra_env,
                    **self.client_env.get(len(self.clients), {}),
                }, self.workdir / f"client{edge_id}.{p}.log", prefix=self.client_prefix, program=program,
                  cold=self.cold)
                self.clients.append(client)
                client.start()
                self.record()
        self._ready(self.clouds + self.edges, registered=True)

    def _ready(self, services: list[Service], registered: bool = False) -> None:
        """Waits for `services` to be healthy (and, with `registered`, for every client to be registered)."""
        for service in services:
            service.wait_healthy()
        if registered:
            self.wait_registered()

    def wait_registered(self, timeout: float = 60.0) -> None:
        """Blocks until every edge sees all of its clients, so round 0 starts with everyone present."""
        deadline = time.monotonic() + timeout
        expected = [len(range(e, self.num_clients, self.num_edges)) for e in range(self.num_edges)]
        while time.monotonic() < deadline:
            seen = [EdgeHealth.model_validate_json(e.health().content).clients for e in self.edges]
            if seen == expected:
                return
            for c in self.clients:
                if not c.alive():
                    raise RuntimeError(f"{c.name} exited:\n{c.log_tail()}")
            time.sleep(0.2)
        raise RuntimeError(f"clients did not register in {timeout}s: {seen} of {expected}")

    def restart_cloud(self, sig: int = signal.SIGKILL) -> None:
        port = int(self._cloud().address().rsplit(":", 1)[1])
        self._cloud().stop(sig)
        self.cloud = self.clouds[0] = self._cloud_service(port)
        self.cloud.start()
        self.record()
        self.cloud.wait_healthy()

    def restart_edge(self, edge_id: int, sig: int = signal.SIGKILL) -> None:
        """Kills an edge and starts it again with the same settings (port, state directory)."""
        edge = self.edges[edge_id]
        edge.stop(sig)
        edge.start()
        self.record()
        edge.wait_healthy()

    def stop(self) -> None:
        with _signals_held():  # a second Ctrl-C or SIGTERM must not cut the stop short and orphan the rest
            for service in [*self.clients, *self.edges, *self.clouds]:
                service.stop()
            if self.redis is not None:
                self.redis.stop()
            self.state_file.unlink(missing_ok=True)

    @property
    def state_file(self) -> Path:
        return self.workdir / STATE_FILE

    def processes(self) -> list[dict[str, Any]]:
        """Every running process of the topology: name, pid, its start time (to tell a reused pid), URL, log."""
        found: list[dict[str, Any]] = []
        if self.redis is not None and self.redis.process is not None:
            found.append({"name": "redis", "pid": self.redis.process.pid, "url": None,
                          "log": str(self.redis.log_path)})
        for service in [*self.clouds, *self.edges, *self.clients]:
            if service.proc is not None:
                found.append({"name": service.name, "pid": service.proc.pid, "url": service.url,
                              "log": str(service.log)})
        for process in found:
            process["started"] = process_start_time(int(process["pid"]))
        return found

    def record(self) -> None:
        """Writes the state file (readable by its owner only: it holds the Redis URL and its password)."""
        state = {"owner": {"pid": os.getpid(), "started": process_start_time(os.getpid())},
                 "redis_url": self.redis_url, "cloud_url": self.front_url or (self.cloud.url if self.cloud else None),
                 "edge_urls": [e.url for e in self.edges], "processes": self.processes(), **self.notes}
        # Written beside it and renamed over it: `fedctl down` reads a whole file, the old or the new.
        partial = self.state_file.with_name(f".{STATE_FILE}.{os.getpid()}")
        write_private(partial, json.dumps(state, indent=1).encode())
        os.replace(partial, self.state_file)

    def __enter__(self) -> "LocalTopology":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


STATE_FILE = "topology.json"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP (a closed terminal) end the process as Ctrl-C does, with a KeyboardInterrupt, so that
    `with LocalTopology(...)` stops every service: each runs in its own session, which neither the terminal's
    Ctrl-C nor its hang-up reaches, and a plain SIGTERM would end this process without running its exits."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """The stop signals wait (pending) until the block ends; only the main thread receives Python's handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def read_state(workdir: Path) -> dict[str, Any] | None:
    """The state a running topology recorded in `workdir`, or None if none is recorded there."""
    try:
        state: dict[str, Any] = json.loads((Path(workdir) / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    return state


def running(process: dict[str, Any]) -> bool:
    """Whether a recorded process (pid and start time) still runs."""
    started = process_start_time(process["pid"])
    return started is not None and started == process.get("started")


def stop_recorded(workdir: Path, timeout: float = 30.0) -> list[str]:
    """Stops the topology recorded in `workdir` from another process (`fedctl down`): its owner first, with
    SIGTERM, which stops the rest as it exits; then whatever still runs (the owner was killed, or it did not
    stop in time), with SIGTERM and after 10 s SIGKILL. Returns the names of the processes it signalled."""
    state = read_state(workdir)
    if state is None:
        return []
    signalled = []
    owner = {"name": "owner", **state["owner"]}
    if owner["pid"] != os.getpid() and running(owner):
        os.kill(owner["pid"], signal.SIGTERM)
        signalled.append(f"fedctl (pid {owner['pid']})")
        _wait_gone([owner], timeout)
    left = [p for p in state["processes"] if running(p)]
    for process in left:
        os.kill(process["pid"], signal.SIGTERM)
        signalled.append(f"{process['name']} (pid {process['pid']})")
    if not _wait_gone(left, 10.0):
        for process in left:
            if running(process):
                os.kill(process["pid"], signal.SIGKILL)
        _wait_gone(left, 5.0)
    (Path(workdir) / STATE_FILE).unlink(missing_ok=True)
    return signalled


def _wait_gone(processes: list[dict[str, Any]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(running(p) for p in processes):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
