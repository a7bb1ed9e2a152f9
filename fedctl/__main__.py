"""fedctl: `fedctl demo` runs a whole federation on this machine; the other commands drive
a cloud anywhere through its REST API."""
from __future__ import annotations

import contextlib
import itertools
import json
import time
import tomllib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

import httpx
import typer
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from fl_services.client.config import parse_ids
from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.certs import write_deployment
from fl_services.fedctl.launch import LocalTopology
from fl_services.fedctl.report import save_results
from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.client_reports import client_reports, group_summary
from fl_services.shared.core.config import DataConfig, DvfsConfig, ModelConfig, RunConfig
from fl_services.shared.core.reports import RoundRecord
from fl_services.shared.runtime.files import write_private
from fl_services.shared.wire.admin import RunInfo
from fl_services.shared.wire.protocol import client_token, derived_token_id, issue_device_tokens, tokens_file_text
from fl_services.shared.wire.tls import client_context

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=True)
console = Console()

CLOUD = typer.Option("http://127.0.0.1:8000", envvar="FL_CLOUD_URL", help="cloud base URL")
TOKEN = typer.Option("dev-admin-token", envvar="FL_ADMIN_TOKEN", help="admin bearer token")


@dataclass
class _Dial:
    """How the commands that drive a cloud verify an https:// one and what certificate they present
    (the options before the command; see `dial`)."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None


_dial = _Dial()


@app.callback()
def dial(ca_file: Optional[Path] = typer.Option(None, envvar="FL_CA_FILE",
                                                help="CA bundle (PEM) an https:// cloud is verified against "
                                                     "(default: the public CAs)"),
         cert_file: Optional[Path] = typer.Option(None, envvar="FL_CERT_FILE",
                                                  help="certificate (PEM) presented to a cloud that requires "
                                                       "one (mutual TLS), e.g. admin.pem of `fedctl certs`"),
         key_file: Optional[Path] = typer.Option(None, envvar="FL_KEY_FILE", help="the key of --cert-file")) -> None:
    """Options for every command that talks to a cloud."""
    _dial.ca_file, _dial.cert_file, _dial.key_file = ca_file, cert_file, key_file


def cloud_api(cloud: str, token: str) -> CloudAPI:
    return CloudAPI(cloud, token, tls=client_context(_dial.ca_file, _dial.cert_file, _dial.key_file))


def load_config(path: Optional[Path], **overrides) -> RunConfig:
    data: dict[str, Any] = {}
    if path is not None:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        if not isinstance(data, dict):  # a list or a string: a traceback (AttributeError) before
            raise ValueError(f"{path}: a run config is a JSON object of settings, not a {type(data).__name__}")
    data.update({k: v for k, v in overrides.items() if v is not None})
    return registry.parse_config(data)


def progress_table(api: CloudAPI, info: RunInfo, started: float) -> Table:
    return history_table(api.history(info.run_id), f"run {info.run_id} · {info.config.algorithm} · "
                         f"{info.status.value} · version {info.version}/{info.rounds} · buffered {info.buffered} · "
                         f"{time.monotonic() - started:.1f}s", last=15)


def history_table(history: list[RoundRecord], title: str, last: int | None = None) -> Table:
    """One row per cloud update; energy is the modelled client energy (DVFS) of the update and of the run so far."""
    # Units in the headers and a light box: the nine columns fit an 80-column terminal without wrapping.
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  collapse_padding=True)
    for col in ("round", "clients", "edges", "train loss", "test loss", "test acc", "time", "energy J",
                "total J"):
        table.add_column(col, justify="right")
    cumulative = list(itertools.accumulate(h.energy_j for h in history))
    for h, total in list(zip(history, cumulative, strict=True))[-last if last else 0:]:
        table.add_row(str(h.version), str(len(h.clients)), ",".join(map(str, h.edges)), f"{h.train_loss:.4f}",
                      f"{h.test_loss:.4f}", f"{100 * h.test_accuracy:.2f}%", f"{h.elapsed_s:.1f}s",
                      f"{h.energy_j:.1f}", f"{total:.1f}")
    return table


def watch_run(api: CloudAPI, run_id: str, timeout_s: float = 3600) -> RunInfo:
    started = time.monotonic()
    with Live(console=console, refresh_per_second=4) as live:
        return api.wait(run_id, timeout_s=timeout_s, poll_s=0.5,
                        on_poll=lambda info: live.update(progress_table(api, info, started)))


def finish(api: CloudAPI, info: RunInfo, out: Path) -> None:
    console.print()
    history = api.history(info.run_id)
    paths = save_results(out, info, history, api.model(info.run_id))
    final = history[-1].test_accuracy if history else float("nan")
    console.print(f"[bold]final test accuracy: {100 * final:.2f}%[/] after {len(history)} rounds "
                  f"({history[-1].elapsed_s:.1f}s)" if history else "no rounds completed")
    summary = group_summary(info.config, client_reports(history))
    if any(summary.values()):
        table = Table(title="clients' latest reports: mean ± spread over clients")
        names = sorted({n for metrics in summary.values() for n in metrics})
        for col in ("group", *names):
            table.add_column(col, justify="right")
        for group, metrics in summary.items():
            table.add_row(group, *(f"{metrics[n][0]:.4f} ± {metrics[n][1]:.4f}" if n in metrics else "–"
                                   for n in names))
        console.print(table)
    for name, path in paths.items():
        console.print(f"  {name:13s} {path}")


@app.command()
def demo(
    config: Optional[Path] = typer.Option(None, help="RunConfig as .json or .toml (defaults: FedAvg, CNN, MNIST 5k)"),
    rounds: Optional[int] = typer.Option(None, help="override the number of rounds"),
    algorithm: Optional[str] = typer.Option(None, help="override the algorithm"),
    clients_per_process: int = typer.Option(5, help="logical clients hosted by one client process"),
    out: Path = typer.Option(Path("results"), help="where results are written"),
    keep: bool = typer.Option(False, "--keep", help="keep the services and the dashboard up after the run, "
                                                     "until Ctrl-C"),
    tls: bool = typer.Option(False, "--tls", help="every hop over HTTPS with mutual TLS, with certificates made "
                                                   "in the run's services/certs directory"),
) -> None:
    """Start Redis, the cloud, the edges and the clients as processes here, train, and save results."""
    cfg = load_config(config, rounds=rounds, algorithm=algorithm)
    n, edges = cfg.data.num_clients, cfg.topology.num_edges
    procs = max(1, -(-n // (edges * clients_per_process)))
    workdir = out / f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.name}"
    console.print(f"starting redis, cloud, {edges} edge(s), {n} clients in {procs * edges} client processes "
                  f"(logs in {workdir})")
    with LocalTopology(num_clients=n, num_edges=edges, procs_per_edge=procs, workdir=workdir / "services",
                       mutual_tls=tls) as topo:
        console.print(f"dashboard: [bold]{topo.cloud_url}/ui/[/] (sign in with the cloud's admin token, "
                      f"FL_CLOUD_ADMIN_TOKEN; this demo's is {topo.admin_token!r})")
        if tls:
            console.print(f"certificates in {topo.certs}: a browser needs ca.pem trusted and admin.pem as its "
                          "client certificate")
        with CloudAPI(topo.cloud_url, topo.admin_token, tls=topo.client_tls()) as api:
            info = api.create_run(cfg)
            api.action(info.run_id, "start")
            info = watch_run(api, info.run_id)
            finish(api, info, workdir)
        if keep:
            console.print(f"the services are still up: the dashboard at {topo.cloud_url}/ui/; Ctrl-C stops them")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)


def _model_and_data_fields() -> str:
    """The model, data and dvfs fields with their defaults, from the config classes themselves (one source)."""
    lines = []
    for section, cls in (("model", ModelConfig), ("data", DataConfig), ("dvfs", DvfsConfig)):
        for name, field in cls.model_fields.items():
            if field.description:
                default = json.dumps(field.get_default(call_default_factory=True))
                lines.append(f"{section}.{name} = {default}: {field.description}")
    return "\n\n".join(lines)


@app.command(epilog=_model_and_data_fields())
def create(config: Optional[Path] = typer.Argument(None, help="RunConfig as .json or .toml (defaults: FedAvg, CNN, "
                                                              "MNIST 5k)"),
           cloud: str = CLOUD, token: str = TOKEN) -> None:
    """Create a run from a config file and print its id. The cloud refuses (422) a config it cannot run,
    e.g. a model factory or data loader it cannot import, or a model that does not fit the data."""
    with cloud_api(cloud, token) as api:
        console.print(api.create_run(load_config(config)).run_id)


@app.command()
def control(run_id: str, action: str = typer.Argument(..., help="start | pause | resume | stop"),
            cloud: str = CLOUD, token: str = TOKEN) -> None:
    """Start, pause, resume or stop a run."""
    with cloud_api(cloud, token) as api:
        console.print(api.action(run_id, action).status.value)


@app.command()
def runs(cloud: str = CLOUD, token: str = TOKEN) -> None:
    """List runs."""
    with cloud_api(cloud, token) as api:
        for info in api.runs():
            console.print(f"{info.run_id}  {info.status.value:9s} {info.config.algorithm:8s} "
                          f"version {info.version}/{info.rounds}  {info.config.name}")


@app.command()
def watch(run_id: str, cloud: str = CLOUD, token: str = TOKEN,
          out: Path = typer.Option(Path("results"), help="where results are written at the end")) -> None:
    """Live progress of a run until it ends, then save its results."""
    with cloud_api(cloud, token) as api:
        finish(api, watch_run(api, run_id), out / run_id)


@app.command()
def results(run_id: str, cloud: str = CLOUD, token: str = TOKEN) -> None:
    """A run's history: per update its clients, loss, accuracy, time and modelled client energy (DVFS), with
    the energy summed over the run so far."""
    with cloud_api(cloud, token) as api:
        info = api.run(run_id)
        console.print(history_table(api.history(run_id), f"run {run_id} · {info.config.algorithm} · "
                                    f"{info.status.value} · version {info.version}/{info.rounds} · "
                                    f"dvfs {info.config.dvfs.policy}"))


@app.command()
def certs(directory: Path = typer.Argument(..., help="where the CA and the certificates are written"),
          host: list[str] = typer.Option([], "--host", help="a name or address the cloud, the edges and Redis are "
                                                            "reached at (repeatable); each server certificate "
                                                            "holds its service name, localhost and 127.0.0.1 "
                                                            "besides"),
          edges: int = typer.Option(2, min=0, help="edges, one certificate each (edge0, edge1, ...)"),
          clients: int = typer.Option(2, min=0, help="client devices, one certificate each (client0, ...)"),
          days: int = typer.Option(365, min=1, help="how long the certificates are valid"),
          force: bool = typer.Option(False, "--force", help="replace an existing CA (every certificate it "
                                                            "signed stops being trusted)")) -> None:
    """Create a CA and the certificates of a TLS deployment: the cloud, each edge, Redis, each client device
    and the operator (admin, for fedctl). See docs/how-to-tls-and-tokens.md for the settings that use them."""
    if (directory / "ca.key").exists() and not force:
        raise ValueError(f"{directory / 'ca.key'} exists: a new CA would make every certificate it signed "
                         "untrusted (--force replaces it)")
    written = write_deployment(directory, edges=edges, clients=clients, hosts=host, days=days)
    for name, (cert, key) in written.items():
        console.print(f"  {name:10s} {cert}  {key}")


@app.command()
def delete(run_id: str, cloud: str = CLOUD, token: str = TOKEN) -> None:
    """Delete a run that is not active (stop it first), with its model and history."""
    with cloud_api(cloud, token) as api:
        api.delete_run(run_id)
        console.print(f"deleted {run_id}")


@app.command()
def audit(limit: int = typer.Option(50, min=1, max=10_000, help="how many of the latest actions"),
          cloud: str = CLOUD, token: str = TOKEN) -> None:
    """The audit log: the latest admin actions, newest first, with who made them."""
    with cloud_api(cloud, token) as api:
        for record in api.audit(limit):
            # One line per record, never wrapped: a log to read with grep and cut.
            typer.echo(f"{record.at:%Y-%m-%d %H:%M:%S}  {record.actor:12s} {record.address or '-':15s} "
                       f"{record.action:7s} {record.target}" + (f"  {record.detail}" if record.detail else ""))


CLIENT_ID = typer.Argument(..., min=0, help="the client id the device plays")
SECRET = typer.Option(..., envvar="FL_EDGE_CLIENT_TOKEN", prompt=True, hide_input=True,
                      help="the edges' client secret")


@app.command("client-token")
def client_token_command(client_id: int = CLIENT_ID, secret: str = SECRET) -> None:
    """Print a device's derived token: with it, the device can act as that client only. Its id, to revoke
    it, is client-<id>; a revoked derived token stays revoked, so prefer issue-token."""
    typer.echo(client_token(secret, client_id))


@app.command("issue-token")
def issue_token(client_ids: str = typer.Argument(..., help='the client id the device plays, or several: "0,2,4", '
                                                           '"0-4" (as a client process\'s FL_CLIENT_CLIENTS)'),
                out: Optional[Path] = typer.Option(None, help="write the tokens to this file (created readable by "
                                                              "its owner only; an existing one is kept) as a client "
                                                              "process's FL_CLIENT_CLIENT_TOKENS_FILE reads them"),
                secret: str = SECRET) -> None:
    """Issue a device a token of its own with a new id (printed on stderr): with it, the device can act as
    that client only, and `fedctl revoke-token <id>` revokes this device alone. With several clients, one
    token each (a JSON map from client id to token, as the client setting client_tokens takes)."""
    try:
        ids = parse_ids(client_ids)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="CLIENT_IDS") from None
    if out is not None and out.exists():
        # Overwriting would lose tokens that stay valid until revoked: the operator removes the file.
        raise typer.BadParameter(f"{out} exists: it may hold tokens still in use; remove it first", param_hint="--out")
    tokens = issue_device_tokens(secret, ids)
    for client_id, issued in tokens.items():
        token_id = issued.split(".")[2]  # fl1.<client id>.<token id>.<mac>
        typer.echo(f"token id: {token_id} (client {client_id}; revoke: fedctl revoke-token {token_id})", err=True)
    as_json = tokens_file_text(tokens)
    if out is not None:
        write_private(out, as_json.encode())
    elif len(ids) == 1:
        typer.echo(tokens[ids[0]])
    else:
        typer.echo(as_json, nl=False)


@app.command("revoke-token")
def revoke_token(token_id: str = typer.Argument(..., help=f"the id issue-token printed, or {derived_token_id(0)} "
                                                           "for client 0's derived token"),
                 cloud: str = CLOUD, token: str = TOKEN) -> None:
    """Revoke one device's token: the edges refuse it from their next refresh on (revocation_refresh_s)."""
    with cloud_api(cloud, token) as api:
        revoked = api.revoke_token(token_id)
        console.print(f"revoked {revoked.token_id} at {revoked.revoked_at:%Y-%m-%d %H:%M:%S}")


def main() -> None:
    """The `fedctl` console script."""
    try:
        app()
    # An operator's mistake or an unreachable cloud is one line to read, not a page of traceback: a config
    # the cloud refuses (the API's RuntimeError with its detail), a file that is not a valid RunConfig
    # (ValueError, pydantic's included), a cloud that does not answer (httpx), a missing file (OSError).
    except (RuntimeError, ValueError, OSError, httpx.HTTPError) as exc:
        console.print(f"[red]error:[/red] {type(exc).__name__}: {exc}", markup=True, highlight=False,
                      soft_wrap=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
