"""The client and fedctl share the wire's constants and the client token with the servers without
importing a server (shared/server/, FastAPI, uvicorn)."""
import json
import subprocess
import sys

SERVER_MODULES = ("fl_services.shared.server", "fastapi", "starlette", "uvicorn", "cloud", "edge")
ENTRY_POINTS = ("fl_services.client.main", "fl_services.fedctl.__main__")


def test_the_client_and_fedctl_do_not_import_a_server():
    # One interpreter imports them in turn, noting after each which server modules are loaded: the first's list
    # is its own, and with it empty the second's is the second's own.
    code = (f"import importlib, json, sys\nloaded = {{}}\nfor m in {ENTRY_POINTS!r}:\n"
            f"    importlib.import_module(m)\n    loaded[m] = [s for s in {SERVER_MODULES!r} if s in sys.modules]\n"
            "print(json.dumps(loaded))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {module: [] for module in ENTRY_POINTS}
