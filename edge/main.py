"""`fl-edge`: the edge app (edge/app.py) served with the settings of its environment. Its --help and a settings
error answer before the app's modules (torch, fastapi) are imported."""
from __future__ import annotations

from fl_services.shared.runtime.extras import SERVER_MODULES, require

USAGE = """usage: fl-edge

An edge service: takes the cloud's global state (FL_EDGE_CLOUD_URL), runs rounds with the clients registered to
it and sends the cloud its contribution. Listens on FL_EDGE_HOST:FL_EDGE_PORT until SIGTERM or Ctrl-C."""


def main() -> None:
    require(SERVER_MODULES, "server", "fl-edge")  # as fl-cloud's (cloud/main.py)
    from fl_services.edge.config import EdgeSettings
    from fl_services.shared.runtime.log import configure_logging
    from fl_services.shared.runtime.settings import answer_help, load_settings

    answer_help(EdgeSettings, USAGE)
    settings = load_settings(EdgeSettings)
    configure_logging(settings.log_level, settings.log_format, edge_id=settings.edge_id)
    from fl_services.edge.app import create_app
    from fl_services.shared.server.serve import serve
    serve(create_app(settings), settings.host, settings.port, settings.log_level, settings)


if __name__ == "__main__":
    main()
