"""Both services' OpenAPI documents as tools meet them: served by running processes, valid for an OpenAPI
validator, every docs asset served by the service itself, and a property-based fuzzer (schemathesis)
driving every operation with a valid token, which must never get a 5xx."""
from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup

from fl_services.fedctl.api import CloudAPI
from fl_services.fedctl.launch import LocalTopology
from fl_services.shared.core.config import RunConfig
from fl_services.shared.server.errors import ErrorDetail

pytestmark = pytest.mark.slow

# Per operation and service (derandomized: the same cases every run). 60 take ~17 s for both services;
# 300 found no 5xx either.
MAX_EXAMPLES = 60
SERVICES = ["cloud", "edge"]


@pytest.fixture(scope="module")
def topology(tmp_path_factory) -> Iterator[LocalTopology]:
    # Long-polls capped at 0.2 s: the fuzzer calls them with any timeout. One client keeps the edge real.
    env = {"FL_CLOUD_LONG_POLL_MAX_S": "0.2", "FL_EDGE_LONG_POLL_MAX_S": "0.2"}
    with LocalTopology(num_clients=1, num_edges=1, procs_per_edge=1, workdir=tmp_path_factory.mktemp("openapi"),
                       extra_env=env) as topo:
        yield topo


@pytest.fixture(scope="module")
def known_ids(topology) -> dict[str, str | int]:
    """Ids that exist (a run, the registered edge and client), so that the fuzzer also reaches what a route
    does past its 404 (random ids are nearly always unknown)."""
    config = RunConfig(model={"name": "logreg"}, data={"dataset": "digits", "num_clients": 1}, rounds=2)
    with CloudAPI(topology.cloud_url, topology.admin_token) as api:
        return {"run_id": api.create_run(config).run_id, "edge_id": 0, "client_id": 0}


def url_of(topology: LocalTopology, service: str) -> str:
    return topology.cloud_url if service == "cloud" else topology.edges[0].url


def token_for(topology: LocalTopology, path: str) -> str:
    """The token each API wants: admin for runs, the edge token for the cloud's edge API, the edge's client
    secret for its client API."""
    if path.startswith(("/api/v1/runs", "/api/v1/audit", "/api/v1/tokens")):
        return topology.admin_token
    if path.startswith("/api/v1/edges"):
        return topology.edge_token
    return topology.client_token


@pytest.mark.parametrize("service", SERVICES)
def test_the_served_document_is_valid_openapi_and_declares_auth_errors_and_binary_bodies(topology, service):
    document = httpx.get(url_of(topology, service) + "/openapi.json").json()
    validate(document)  # raises on any schema error or unresolvable reference
    assert "$defs" not in str(document)
    scheme = document["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    error_ref = {"$ref": "#/components/schemas/ErrorDetail"}
    assert document["components"]["schemas"]["ErrorDetail"]["required"] == list(ErrorDetail.model_fields)
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            guarded = path.startswith("/api/")
            assert (op.get("security") == [{"bearer": []}]) == guarded, (method, path)
            if guarded:
                unauthorized = op["responses"]["401"]["content"]["application/json"]["schema"]
                assert unauthorized == error_ref, (method, path)
            if method == "post" and path == "/api/v1/clients/results":  # a result bundle: each result's outcome in 200
                content = op["requestBody"]["content"]
                assert content["application/vnd.fl.result-bundle"]["schema"]["format"] == "binary"
                assert {"200", "400", "413"} <= set(op["responses"]), (method, path)
            elif method == "post" and path.endswith(("/contributions", "/results")):
                content = op["requestBody"]["content"]
                assert content["application/vnd.safetensors"]["schema"]["format"] == "binary"
                assert {"400", "404", "409", "413", "422"} <= set(op["responses"]), (method, path)
            if "requestBody" in op:  # every body is bounded in size and in time
                assert {"408", "413"} <= set(op["responses"]), (method, path)
            if guarded and "{" in path:  # an id that may name nothing
                assert "404" in op["responses"], (method, path)
            if method == "post" and path.endswith(("/edges", "/clients", "/contributions", "/results", "/failures")):
                assert "429" in op["responses"], (method, path)  # rate limited per caller


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_the_api_docs_load_their_assets_from_the_service(topology, service, path):
    # (The browser test renders them with zero requests to another host; this one names each asset.)
    base = url_of(topology, service)
    page = httpx.get(base + path)
    assert page.status_code == 200
    refs = re.findall(r'(?:src|href|url)\s*[=:]\s*[\'"]([^\'"]+)[\'"]', page.text)
    assert refs and all(ref.startswith("/") for ref in refs), refs
    for ref in refs:
        assert httpx.get(base + ref).status_code == 200, ref


@pytest.fixture
def session() -> Iterator[requests.Session]:
    """One session for every case of a service: its connections are kept alive between cases, as a client's are,
    rather than each case opening (and the service accepting) a connection of its own. Closed after the test."""
    with requests.Session() as session:
        yield session


FUZZ = settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("service", SERVICES)
def test_the_fuzzer_gets_no_server_error(topology, known_ids, session, service):
    schema = schemathesis.openapi.from_url(url_of(topology, service) + "/openapi.json")
    failures, operations = [], 0
    for loaded in schema.get_all_operations():
        operation = loaded.ok()
        operations += 1
        # Valid input and input that breaks the schema, with random ids and with existing ones (but for the
        # event stream, which stays open as long as an existing run lives): never a 5xx.
        known = {name: known_ids[name] for name in known_ids if "{" + name + "}" in operation.path}
        # (Nor for a delete: the known run deleted, every later operation would meet a 404.)
        id_choices = [None] + ([known] if known and not operation.path.endswith("/events")
                               and operation.method.upper() != "DELETE" else [])

        @FUZZ
        @given(case=st.one_of(*(operation.as_strategy(mode, path_parameters=ids)
                                for mode in GenerationMode for ids in id_choices)))
        def fuzz(case) -> None:
            # A valid token, so the fuzzer gets past the guard to the route itself.
            case.call_and_validate(session=session,
                                   headers={"Authorization": f"Bearer {token_for(topology, case.path)}"},
                                   checks=[not_a_server_error], timeout=15)

        try:
            fuzz()
        except (Exception, FailureGroup) as exc:  # every operation is fuzzed; the failures are reported together
            failures.append(f"{operation.label}: {exc}")
    assert operations >= 4
    assert failures == [], "\n\n".join(failures)
    # ~17 s for both services on an idle machine; on a 2-core machine shared with other work, up to 120 s
    # were measured for one.
