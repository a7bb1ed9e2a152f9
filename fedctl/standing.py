"""`fedctl up` and `fedctl down`: a standing local topology (Redis, the cloud, N edges, optionally simulated
clients) that stays up until Ctrl-C, SIGTERM, SIGHUP or `fedctl down`, with its state in one directory."""
from __future__ import annotations

import os
import secrets
import socket
import time
from pathlib import Path

from rich.console import Console

from fl_services.fedctl.launch import LocalTopology, read_state, running, stop_on_signals, stop_recorded
from fl_services.shared.runtime.files import write_private

console = Console(highlight=False)

TOKENS_FILE = "tokens.env"


def default_dir() -> Path:
    """Where `fedctl up` keeps its state when not told: one per user, so that `fedctl down` finds it."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "fl-services" / "up"


def tokens(directory: Path) -> dict[str, str]:
    """The topology's tokens, made once and kept in DIRECTORY/tokens.env (readable by its owner only), so that a
    topology brought up again accepts the tokens its operator and devices already hold."""
    path = directory / TOKENS_FILE
    if path.exists():
        pairs = (line.removeprefix("export ").split("=", 1) for line in path.read_text().splitlines()
                 if "=" in line and not line.startswith("#"))
        return {k.strip(): v.strip() for k, v in pairs}
    made = {"FL_ADMIN_TOKEN": secrets.token_urlsafe(24), "FL_EDGE_TOKEN": secrets.token_urlsafe(24),
            "FL_EDGE_CLIENT_TOKEN": secrets.token_urlsafe(24)}
    write_private(path, ("# fedctl up's tokens: `. tokens.env` sets them for fedctl and fl-client\n"
                         + "".join(f"export {k}={v}\n" for k, v in made.items())).encode())
    return made


def _check_port(port: int, option: str) -> None:
    if port == 0:
        return
    with socket.socket() as sock:
        # As the service binds it (SO_REUSEADDR): connections of an earlier run left in TIME_WAIT do not hold it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            raise ValueError(f"port {port} is in use (another `fedctl up`, or another service): {option} picks "
                             "another, 0 a free one") from None


def up(*, directory: Path, edges: int, clients: int, procs_per_edge: int, cloud_port: int, edge_port: int,
       log_level: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    state = read_state(directory)
    if state is not None and running({"name": "owner", **state["owner"]}):
        raise ValueError(f"a topology is already up in {directory} (fedctl pid {state['owner']['pid']}): "
                         f"`fedctl down --dir {directory}` stops it")
    if state is not None:  # left by a fedctl that was killed: its services may still run
        stop_recorded(directory)
    _check_port(cloud_port, "--cloud-port")
    for l in range(edges):
        _check_port(edge_port + l if edge_port else 0, "--edge-port")
    held = tokens(directory)
    topology = LocalTopology(num_clients=clients, num_edges=edges, procs_per_edge=procs_per_edge, workdir=directory,
                             admin_token=held["FL_ADMIN_TOKEN"], edge_token=held["FL_EDGE_TOKEN"],
                             client_token=held["FL_EDGE_CLIENT_TOKEN"], key_prefix="fl", log_level=log_level,
                             cloud_port=cloud_port, edge_port=edge_port)
    console.print(f"starting redis, the cloud, {edges} edge(s) and {clients} simulated client(s) (logs and state "
                  f"in {directory})")
    with stop_on_signals():
        try:
            with topology:
                topology.notes = {"tokens_file": str(directory / TOKENS_FILE)}
                topology.record()
                _print_topology(topology, directory)
                while True:  # until a signal (KeyboardInterrupt) or a service that dies
                    for service in [*topology.clouds, *topology.edges, *topology.clients]:
                        if not service.alive():
                            raise RuntimeError(f"{service.name} exited (log {service.log}): stopping the topology\n"
                                               f"{service.log_tail(5)}")
                    time.sleep(1.0)
        except KeyboardInterrupt:
            console.print("stopped: every service of the topology has ended")


def _print_topology(topology: LocalTopology, directory: Path) -> None:
    cloud = topology.cloud_url
    tokens_file = directory / TOKENS_FILE
    console.print(f"[bold]up[/]: cloud {cloud}  (dashboard {cloud}/ui/, API docs {cloud}/docs, "
                  f"metrics {cloud}/metrics)")
    for l, edge in enumerate(topology.edges):
        console.print(f"     edge {l} {edge.url}  (serves the clients k with k mod {topology.num_edges} = {l})")
    console.print(f"     redis {topology.redis.url.split('@')[-1] if topology.redis else topology.redis_url}  "
                  f"(password in {topology.state_file})")
    console.print(f"tokens: in {tokens_file}; `. {tokens_file}` sets them for fedctl and fl-client:")
    console.print(f"  fedctl runs --cloud {cloud}                       (FL_ADMIN_TOKEN: the dashboard's sign-in too)")
    console.print("  fedctl issue-token 7 --out client7.tokens      (FL_EDGE_CLIENT_TOKEN: a device token of its own)")
    edge7 = topology.edges[7 % topology.num_edges].url if topology.edges else "EDGE"
    console.print(f"  FL_CLIENT_CLIENT_TOKENS_FILE=client7.tokens fl-client --edge {edge7} --clients 7")
    console.print(f"  or: FL_CLIENT_CLIENT_TOKEN=$FL_EDGE_CLIENT_TOKEN fl-client --edge {edge7} --clients 7")
    console.print(f"a run: fedctl create examples/<config>.json --cloud {cloud}, then fedctl control RUN start")
    console.print(f"stop: Ctrl-C here, or `fedctl down --dir {directory}`")


def down(*, directory: Path) -> None:
    state = read_state(directory)
    if state is None:
        raise ValueError(f"no topology is recorded in {directory} (nothing to stop; `fedctl up --dir` names where "
                         "one runs)")
    stopped = stop_recorded(directory)
    console.print(f"stopped {', '.join(stopped)}" if stopped else "nothing was running; its state is cleared")
