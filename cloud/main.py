"""`fl-cloud`: the cloud app (cloud/app.py) served with the settings of its environment. Its --help, a settings
error and a Redis that refuses the cloud answer before the app's modules (torch, fastapi) are imported."""
from __future__ import annotations

import logging

from fl_services.shared.runtime.extras import SERVER_MODULES, require

log = logging.getLogger(__name__)

USAGE = """usage: fl-cloud

The cloud service: the control API, the dashboard (/ui/) and the edges' API over HTTP, with its state in Redis
(FL_CLOUD_REDIS_URL). Listens on FL_CLOUD_HOST:FL_CLOUD_PORT until SIGTERM or Ctrl-C."""


def main() -> None:
    # Before anything of the server's is imported (the settings parse their rate limit with `limits`): a device's
    # install, without the extra, gets one line saying what to install.
    require(SERVER_MODULES, "server", "fl-cloud")
    from fl_services.cloud.config import CloudSettings
    from fl_services.cloud.storage import StorageRefused
    from fl_services.cloud.storage.redis import check_redis, prepared_blob_files
    from fl_services.shared.runtime.log import configure_logging
    from fl_services.shared.runtime.settings import answer_help, load_settings

    answer_help(CloudSettings, USAGE)
    settings = load_settings(CloudSettings)
    configure_logging(settings.log_level, settings.log_format)
    try:
        if settings.storage == "redis":
            check_redis(settings.redis_url, settings.redis_options())
        if settings.blob_dir is not None:
            prepared_blob_files(settings.blob_dir, prefix=settings.key_prefix, orphan_s=settings.blob_orphan_s)
    except StorageRefused as exc:
        log.critical("%s; not starting", exc)
        raise SystemExit(1) from None
    from fl_services.cloud.app import create_app
    from fl_services.shared.server.serve import serve
    serve(create_app(settings), settings.host, settings.port, settings.log_level, settings)


if __name__ == "__main__":
    main()
