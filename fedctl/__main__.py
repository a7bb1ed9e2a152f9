"""fedctl: `fedctl up` starts a standing federation on this machine (`fedctl down` stops it), `fedctl demo`
trains one run on a fresh one; the other commands drive a cloud anywhere through its REST API."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

# Only typer at import: `fedctl --help` and a mistyped command answer at once. Each command imports what it
# uses (torch among it, for the model and the data) in its body.
if TYPE_CHECKING:
    from fl_services.fedctl.api import CloudAPI
    from fl_services.shared.core.config import RunConfig

SETTINGS = """Settings (environment variables, each also an option of the commands that use it):
FL_CLOUD_URL: the cloud's base URL (default http://127.0.0.1:8000, where `fedctl up` puts it);
FL_ADMIN_TOKEN: an admin token of the cloud (`fedctl up` writes its own to tokens.env);
FL_CA_FILE, FL_CERT_FILE, FL_KEY_FILE: TLS: the CA an https:// cloud is verified against, the certificate
(and key) presented under mutual TLS; FL_EDGE_CLIENT_TOKEN: the edges' client secret (client-token,
issue-token); FL_UP_DIR: where `fedctl up` keeps its state and logs."""

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=True, epilog=SETTINGS)

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
    from fl_services.fedctl.api import CloudAPI
    from fl_services.shared.wire.tls import client_context

    return CloudAPI(cloud, token, tls=client_context(_dial.ca_file, _dial.cert_file, _dial.key_file))


def load_config(path: Optional[Path], **overrides: Any) -> RunConfig:
    from fl_services.fedctl.configs import load_config as load

    return load(path, **overrides)


@app.command()
def demo(
    config: Optional[Path] = typer.Option(None, help="RunConfig as .json, .toml or .yaml (defaults: FedAvg, CNN, "
                                                     "MNIST 5k)"),
    rounds: Optional[int] = typer.Option(None, help="override the number of rounds"),
    algorithm: Optional[str] = typer.Option(None, help="override the algorithm"),
    clients_per_process: int = typer.Option(5, help="logical clients hosted by one client process"),
    out: Path = typer.Option(Path("results"), help="where results are written"),
    keep: bool = typer.Option(False, "--keep", help="keep the services and the dashboard up after the run, "
                                                     "until Ctrl-C"),
    tls: bool = typer.Option(False, "--tls", help="every hop over HTTPS with mutual TLS, with certificates made "
                                                   "in the run's services/certs directory"),
) -> None:
    """Start Redis, the cloud, the edges and the clients as processes here, train, and save results. Ctrl-C,
    SIGTERM or SIGHUP stops every process it started."""
    import time
    from datetime import datetime

    from fl_services.fedctl.api import CloudAPI
    from fl_services.fedctl.display import console, finish, watch_run
    from fl_services.fedctl.launch import LocalTopology, stop_on_signals

    cfg = load_config(config, rounds=rounds, algorithm=algorithm)
    n, edges = cfg.data.num_clients, cfg.topology.num_edges
    procs = max(1, -(-n // (edges * clients_per_process)))
    workdir = out / f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.name}"
    console.print(f"starting redis, cloud, {edges} edge(s), {n} clients in {procs * edges} client processes "
                  f"(logs in {workdir / 'services'})")
    with stop_on_signals(), LocalTopology(num_clients=n, num_edges=edges, procs_per_edge=procs,
                                          workdir=workdir / "services", mutual_tls=tls, log_level="info") as topo:
        console.print(f"dashboard: [bold]{topo.cloud_url}/ui/[/] (sign in with the cloud's admin token, "
                      f"FL_CLOUD_ADMIN_TOKEN; this demo's is {topo.admin_token!r})")
        for l, edge in enumerate(topo.edges):
            console.print(f"edge {l}: {edge.url}")
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
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass


UP_DIR = typer.Option(None, "--dir", envvar="FL_UP_DIR",
                      help="where the topology keeps its state (pids, ports), tokens, logs and Redis' data "
                           "(default: ~/.local/state/fl-services/up)")


@app.command()
def up(directory: Optional[Path] = UP_DIR,
       edges: int = typer.Option(1, min=1, max=100, help="edges (edge l serves the clients k with k mod N = l)"),
       clients: int = typer.Option(0, min=0, help="simulated clients (0..M-1) as processes here; 0: none, the "
                                                  "devices connect themselves"),
       procs_per_edge: int = typer.Option(1, min=1, help="client processes per edge hosting the simulated clients"),
       cloud_port: int = typer.Option(8000, min=0, max=65535, help="the cloud's port (0: a free one)"),
       edge_port: int = typer.Option(8100, min=0, max=65535, help="edge 0's port, edge l's is this + l (0: free "
                                                                  "ones)"),
       log_level: str = typer.Option("info", help="the services' log level (their logs are in --dir)")) -> None:
    """A standing local topology: Redis, the cloud and N edges (and M simulated clients) as processes here, up
    until Ctrl-C, SIGTERM, SIGHUP or `fedctl down`. Prints every URL and how to get tokens."""
    from fl_services.fedctl.standing import default_dir
    from fl_services.fedctl.standing import up as bring_up

    bring_up(directory=directory or default_dir(), edges=edges, clients=clients, procs_per_edge=procs_per_edge,
             cloud_port=cloud_port, edge_port=edge_port, log_level=log_level)


@app.command()
def down(directory: Optional[Path] = UP_DIR) -> None:
    """Stop the topology `fedctl up` runs (its fedctl, which stops the rest; any process left after it)."""
    from fl_services.fedctl.standing import default_dir
    from fl_services.fedctl.standing import down as bring_down

    bring_down(directory=directory or default_dir())


def _model_and_data_fields() -> str:
    """The model, data and dvfs fields with their defaults, from the config classes themselves (one source)."""
    from fl_services.shared.core.config import DataConfig, DvfsConfig, ModelConfig

    lines = []
    for section, cls in (("model", ModelConfig), ("data", DataConfig), ("dvfs", DvfsConfig)):
        for name, field in cls.model_fields.items():
            if field.description:
                default = json.dumps(field.get_default(call_default_factory=True))
                lines.append(f"{section}.{name} = {default}: {field.description}")
    return "\n\n".join(lines)


class _FieldsEpilog(typer.core.TyperCommand):
    """`create --help`'s epilog, made when the help is shown: the config classes are not imported otherwise."""

    @property
    def epilog(self) -> str:
        return _model_and_data_fields()

    @epilog.setter
    def epilog(self, value: str | None) -> None:
        pass


@app.command(cls=_FieldsEpilog)
def create(config: Optional[Path] = typer.Argument(None, help="RunConfig as .json, .toml or .yaml (defaults: "
                                                              "FedAvg, CNN, MNIST 5k)"),
           cloud: str = CLOUD, token: str = TOKEN) -> None:
    """Create a run from a config file and print its id. The cloud refuses (422) a config it cannot run,
    e.g. a model factory or data loader it cannot import, or a model that does not fit the data."""
    with cloud_api(cloud, token) as api:
        typer.echo(api.create_run(load_config(config)).run_id)


@app.command()
def control(run_id: str, action: str = typer.Argument(..., help="start | pause | resume | stop"),
            cloud: str = CLOUD, token: str = TOKEN) -> None:
    """Start, pause, resume or stop a run."""
    from typing import get_args

    from fl_services.shared.wire.admin import RunAction

    if action not in get_args(RunAction):
        raise typer.BadParameter(f"{action!r}: start, pause, resume or stop", param_hint="action")
    with cloud_api(cloud, token) as api:
        typer.echo(api.action(run_id, action).status.value)


@app.command()
def runs(cloud: str = CLOUD, token: str = TOKEN) -> None:
    """List runs."""
    from fl_services.shared.core.reports import RunStatus

    with cloud_api(cloud, token) as api:
        for info in api.runs():
            # What a waiting run waits for, or why the cloud stopped one, on the run's line.
            why = f"  ({info.reason})" if info.reason and info.status in (RunStatus.waiting, RunStatus.stopped) else ""
            typer.echo(f"{info.run_id}  {info.status.value:9s} {info.config.algorithm:8s} "
                       f"version {info.version}/{info.rounds}  {info.config.name}{why}")


@app.command()
def watch(run_id: str, cloud: str = CLOUD, token: str = TOKEN,
          out: Path = typer.Option(Path("results"), help="where results are written at the end")) -> None:
    """Live progress of a run until it ends, then save its results."""
    from fl_services.fedctl.display import finish, watch_run

    with cloud_api(cloud, token) as api:
        finish(api, watch_run(api, run_id), out / run_id)


@app.command()
def results(run_id: str, cloud: str = CLOUD, token: str = TOKEN) -> None:
    """A run's history: per round (numbered from 0, as the dashboard and the CSV number them) its clients,
    failed clients, loss, accuracy, time and modelled client energy (DVFS), with the energy summed over the run
    so far; then each client that failed, with what it reported."""
    from fl_services.fedctl.display import show_results, site_names

    with cloud_api(cloud, token) as api:
        info = api.run(run_id)
        show_results(info, api.history(run_id), site_names(api, info))


@app.command()
def export(run_id: str, format: str = typer.Option("csv", "--format", help="csv | json | png"),
           out: Optional[Path] = typer.Option(None, help="the file written (default: RUN_ID.FORMAT here; - : "
                                                         "standard output, csv and json)"),
           cloud: str = CLOUD, token: str = TOKEN) -> None:
    """Export a run's history: csv (one row per round, failed clients with their reasons), json (the records as
    the API serves them) or png (the accuracy curve)."""
    from fl_services.fedctl.report import export_history

    if format not in ("csv", "json", "png"):
        raise typer.BadParameter(f"{format!r}: csv, json or png", param_hint="--format")
    with cloud_api(cloud, token) as api:
        where = export_history(api.run(run_id), api.history(run_id), format, out)  # type: ignore[arg-type]
    if where != "standard output":
        typer.echo(f"wrote {where}", err=True)


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
    from fl_services.fedctl.certs import write_deployment

    if (directory / "ca.key").exists() and not force:
        raise ValueError(f"{directory / 'ca.key'} exists: a new CA would make every certificate it signed "
                         "untrusted (--force replaces it)")
    written = write_deployment(directory, edges=edges, clients=clients, hosts=host, days=days)
    for name, (cert, key) in written.items():
        typer.echo(f"  {name:10s} {cert}  {key}")


@app.command()
def delete(run_id: str, cloud: str = CLOUD, token: str = TOKEN) -> None:
    """Delete a run that is not active (stop it first), with its model and history."""
    with cloud_api(cloud, token) as api:
        api.delete_run(run_id)
        typer.echo(f"deleted {run_id}")


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
    from fl_services.shared.wire.protocol import client_token

    typer.echo(client_token(secret, client_id))


@app.command("issue-token")
def issue_token(client_ids: str = typer.Argument(..., help='the client id the device plays, or several: "0,2,4", '
                                                           '"0-4" (as a client process\'s FL_CLIENT_CLIENTS)'),
                out: Optional[Path] = typer.Option(None, help="write the tokens to this file (created readable by "
                                                              "its owner only; an existing one is kept) as a client "
                                                              "process's FL_CLIENT_CLIENT_TOKENS_FILE reads them"),
                site: Optional[str] = typer.Option(None, help="the site (edge name, FL_EDGE_NAME) the device may join: "
                                                              "another site's edge refuses the token (403)"),
                secret: str = SECRET) -> None:
    """Issue a device a token of its own with a new id (printed on stderr): with it, the device can act as
    that client only, and `fedctl revoke-token <id>` revokes this device alone. With several clients, one
    token each (a JSON map from client id to token, as the client setting client_tokens takes). With --site, the
    token is taken at that site's edge only."""
    from pydantic import ValidationError

    from fl_services.client.config import parse_ids
    from fl_services.shared.runtime.files import write_private
    from fl_services.shared.wire.edge_cloud import EdgeRegistration
    from fl_services.shared.wire.protocol import issue_device_tokens, tokens_file_text

    try:
        ids = parse_ids(client_ids)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="CLIENT_IDS") from None
    try:  # a name an edge could have: the token names the site as the edge's FL_EDGE_NAME does
        EdgeRegistration(edge_id=0, name=site)
    except ValidationError as exc:
        raise typer.BadParameter(exc.errors()[0]["msg"], param_hint="--site") from None
    if out is not None and out.exists():
        # Overwriting would lose tokens that stay valid until revoked: the operator removes the file.
        raise typer.BadParameter(f"{out} exists: it may hold tokens still in use; remove it first", param_hint="--out")
    tokens = issue_device_tokens(secret, ids, site)
    for client_id, issued in tokens.items():
        token_id = issued.split(".")[2]  # fl1.<client id>.<token id>.<mac>[~<site>]
        typer.echo(f"token id: {token_id} (client {client_id}; revoke: fedctl revoke-token {token_id})", err=True)
    as_json = tokens_file_text(tokens)
    if out is not None:
        write_private(out, as_json.encode())
    elif len(ids) == 1:
        typer.echo(tokens[ids[0]])
    else:
        typer.echo(as_json, nl=False)


@app.command("revoke-token")
def revoke_token(token_id: str = typer.Argument(..., help="the id issue-token printed, or client-<id> for a "
                                                           "client's derived token (client-token)"),
                 cloud: str = CLOUD, token: str = TOKEN) -> None:
    """Revoke one device's token: the edges refuse it from their next refresh on (revocation_refresh_s)."""
    with cloud_api(cloud, token) as api:
        revoked = api.revoke_token(token_id)
        typer.echo(f"revoked {revoked.token_id} at {revoked.revoked_at:%Y-%m-%d %H:%M:%S}")


def main() -> None:
    """The `fedctl` console script."""
    import logging

    # A passing fault is retried quietly: what fails in the end is said once, below.
    logging.getLogger("fl_services.shared.wire.retry").setLevel(logging.ERROR)
    try:
        app()
    # An operator's mistake or an unreachable cloud is one line to read, with what to change, not a page of
    # traceback: a config the cloud or its model refuses, a file that cannot be read, a cloud that does not
    # answer or refuses the token. Anything else is a defect and keeps its traceback.
    except Exception as exc:
        from fl_services.fedctl.errors import describe, is_operator_error

        if not is_operator_error(exc):
            raise
        typer.echo(f"error: {describe(exc)}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
