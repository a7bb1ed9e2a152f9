"""The client and fedctl share the wire's constants and the client token with the servers without
importing a server (shared/server/, FastAPI, uvicorn)."""
import json
import subprocess
import sys

import pytest

SERVER_MODULES = ("fl_services.shared.server", "fastapi", "starlette", "uvicorn", "cloud", "edge")


@pytest.mark.parametrize("module", ["fl_services.client.main", "fl_services.fedctl.__main__"])
def test_the_client_and_fedctl_do_not_import_a_server(module):
    code = f"import json, sys, {module}\nprint(json.dumps([m for m in {SERVER_MODULES!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []
