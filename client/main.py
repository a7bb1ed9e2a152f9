"""Start a client process: `python -m fl_services.client.main --edge http://EDGE:8100 --clients 0-4`."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import httpx
import typer

from fl_services.client.config import ClientSettings
from fl_services.shared.core.data import DataSourceError
from fl_services.shared.runtime import tune_collector
from fl_services.shared.runtime.log import configure_logging
from fl_services.shared.runtime.settings import load_settings, settings_help
from fl_services.shared.wire.http import make_client
from fl_services.shared.wire.tls import client_context

log = logging.getLogger(__name__)
app = typer.Typer(add_completion=False, help=__doc__)


def _help(what: str, field: str) -> str:
    # The variable and default come from ClientSettings itself, so the help cannot drift from them.
    default = ClientSettings.model_fields[field].default
    return f"{what} (env FL_CLIENT_{field.upper()}; default {'unset' if default is None else default})"


# Every setting, also those without an option (each option names its variable too).
@app.command(epilog=settings_help(ClientSettings))
def run(
    edge: Optional[str] = typer.Option(None, help=_help("edge URL", "edge_url")),
    clients: Optional[str] = typer.Option(None, help=_help('logical client ids, e.g. "0-4" or "1,3,5"', "clients")),
    token: Optional[str] = typer.Option(None, help=_help("client bearer token", "client_token")),
    state_dir: Optional[Path] = typer.Option(None, help=_help("where per-client state is kept", "state_dir")),
    data_path: Optional[str] = typer.Option(None, help=_help("this machine's copy of an npz federated dataset",
                                                             "data_path")),
    data: Optional[str] = typer.Option(None, help=_help("this device's own data, e.g. npz:/data/site.npz or "
                                                        "csv:/data/t.csv?label=target", "data")),
    threads: Optional[int] = typer.Option(None, help=_help("torch threads for local training", "torch_threads")),
    edge_ca_file: Optional[Path] = typer.Option(None, help=_help("CA bundle an https:// edge is verified against",
                                                                 "edge_ca_file")),
    edge_cert_file: Optional[Path] = typer.Option(None, help=_help("certificate presented to the edge (mutual TLS)",
                                                                   "edge_cert_file")),
    edge_key_file: Optional[Path] = typer.Option(None, help=_help("the key of --edge-cert-file", "edge_key_file")),
    device: Optional[str] = typer.Option(None, help=_help("where local training runs: auto, cpu, cuda or cuda:N",
                                                          "device")),
) -> None:
    overrides: dict[str, Any] = {k: v for k, v in {
        "edge_url": edge, "clients": clients, "client_token": token, "state_dir": state_dir,
        "data_path": data_path, "data": data, "torch_threads": threads, "edge_ca_file": edge_ca_file,
        "edge_cert_file": edge_cert_file, "edge_key_file": edge_key_file, "device": device,
    }.items() if v is not None}
    settings = load_settings(ClientSettings, **overrides)  # e.g. a GPU this machine lacks: one line, exit 1
    configure_logging(settings.log_level, settings.log_format)
    tune_collector()
    # Training's modules (torch) load once the settings are read: --help and a settings error answer without them.
    import torch

    from fl_services.client.feed import ClientsStopped
    from fl_services.client.worker import own_source
    torch.set_num_threads(settings.torch_threads)
    try:
        ids = settings.hosted_ids()
    except ValueError as exc:  # e.g. more shards than clients: a configuration error, said in one line
        log.critical("%s; exiting", exc)
        raise typer.Exit(code=2) from None
    if settings.data is not None:
        try:  # read now: a device whose data cannot be read says so at start-up, not at its first task
            summary = own_source(settings.data).summary()
        except DataSourceError as exc:
            log.critical("%s; exiting", exc)
            raise typer.Exit(code=2) from None
        log.info("client %d trains on its own data %s: %s", ids[0], settings.data, summary.model_dump_json())
    try:
        with asyncio.Runner(loop_factory=_event_loop_factory()) as runner:
            runner.run(_serve(settings, ids))
    except ClientsStopped as exc:  # nothing left to serve: exit non-zero rather than sit idle
        log.critical("%s; exiting", exc)
        raise typer.Exit(code=1) from None
    except NotAnEdge as exc:
        log.critical("%s; exiting", exc)
        raise typer.Exit(code=2) from None


def _event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (it comes with the server extra, as in a simulation run beside
    the services), else asyncio's: a device needs no extra to train."""
    try:
        import uvloop
    except ModuleNotFoundError:
        return None
    return uvloop.new_event_loop


class NotAnEdge(Exception):
    """What answers at the edge URL is another service: retrying would never make it an edge."""


async def _serve(settings: ClientSettings, ids: list[int]) -> None:
    from fl_services.client.worker import Worker
    tls = client_context(settings.edge_ca_file, settings.edge_cert_file, settings.edge_key_file)
    async with make_client(settings.edge_url, settings.client_token, settings.long_poll_s, tls=tls) as edge:
        await check_edge(edge, settings.edge_url)
        await Worker(settings, ids, edge).run()


async def check_edge(edge: httpx.AsyncClient, url: str) -> None:
    """Raises NotAnEdge when the service at `url` says it is not an edge (its /health names another service,
    e.g. the cloud's URL given by mistake) or has no /health at all. An edge that is not up yet is waited for
    (the client's retries), and an error status leaves the decision to the worker, whose calls say more."""
    response = await edge.get("/health")
    hint = "FL_CLIENT_EDGE_URL (--edge) must name an edge (`fedctl up` prints the edges' URLs)"
    if response.status_code == 404:
        raise NotAnEdge(f"{url} has no /health: it is not an edge; {hint}")
    if response.status_code != 200:
        return
    try:
        service = response.json().get("service")
    except (ValueError, AttributeError):
        service = None
    if service != "edge":
        what = f"the {service}" if isinstance(service, str) else "a service that does not say what it is"
        raise NotAnEdge(f"{url} is {what}, not an edge; {hint}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
