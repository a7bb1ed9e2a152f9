"""What every process needs whatever it serves: its settings' sources, its logging, durable files,
background tasks' end and its garbage collector's settings.
Imports no other layer."""
from __future__ import annotations

from fl_services.shared.runtime.collector import tune_collector
from fl_services.shared.runtime.files import atomic_write, write_private
from fl_services.shared.runtime.log import bind, configure_logging
from fl_services.shared.runtime.settings import ServiceSettings, is_loopback, load_settings
from fl_services.shared.runtime.tasks import cancel_until_done

__all__ = ["ServiceSettings", "atomic_write", "bind", "cancel_until_done", "configure_logging", "is_loopback",
           "load_settings", "tune_collector", "write_private"]
