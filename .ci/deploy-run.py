"""One training run through a compose deployment's REST API, checked (the deploy tier, .ci/deploy).

Standard library only, so that it runs with any Python 3 (.ci/deploy runs it inside the cloud image, on the
host network). It creates the run from a RunConfig file, starts it, waits for `finished`, then checks the
run's history (every round numbered in turn, every edge of the run and every client in each round, no failed
client; for a run over registered devices, its selected sites and exactly the devices FL_DEVICES names; with
federated evaluation, each round's figures from every device and site),
the model download's version and the final accuracy against a floor. It prints one line per round and, last,
one line of JSON with what it measured; its exit status is 0 only if every check held.

Environment: FL_CLOUD_URL (http[s]://127.0.0.1:8000), FL_ADMIN_TOKEN_FILE, FL_RUN_CONFIG (a JSON RunConfig),
FL_ROUNDS (overrides the config's rounds), FL_MIN_ACCURACY (0.9), FL_RUN_TIMEOUT_S (900), FL_DEVICES (the ids of the
devices a run with a selection must train in every round, e.g. "1001,1002"); over TLS also
FL_CA_FILE, FL_CERT_FILE and FL_KEY_FILE (the admin's certificate: the cloud requires one).
"""
from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from typing import Any


class Cloud:
    def __init__(self, url: str, token: str, context: ssl.SSLContext | None) -> None:
        self.url, self.token, self.context = url.rstrip("/"), token, context

    def call(self, method: str, path: str, body: Any = None, timeout: float = 120) -> tuple[int, bytes, dict]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.context) as response:
                return response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as error:
            raise SystemExit(f"deploy-run: {method} {path}: {error.code} {error.read()[:500]!r}") from None

    def json(self, method: str, path: str, body: Any = None, timeout: float = 120) -> Any:
        # Strict JSON, as the API promises: a figure not yet evaluated is null, never NaN.
        return json.loads(self.call(method, path, body, timeout)[1], parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"the API sent {name}, which is not JSON")


def main() -> int:
    env = os.environ
    context = None
    if env["FL_CLOUD_URL"].startswith("https:"):
        context = ssl.create_default_context(cafile=env["FL_CA_FILE"])
        context.load_cert_chain(env["FL_CERT_FILE"], env["FL_KEY_FILE"])
    with open(env["FL_ADMIN_TOKEN_FILE"]) as f:
        cloud = Cloud(env["FL_CLOUD_URL"], f.read().strip(), context)
    with open(env["FL_RUN_CONFIG"]) as f:
        config = json.load(f)
    if env.get("FL_ROUNDS"):
        config["rounds"] = int(env["FL_ROUNDS"])
    rounds = config["rounds"]
    floor = float(env.get("FL_MIN_ACCURACY", "0.9"))
    deadline = time.monotonic() + float(env.get("FL_RUN_TIMEOUT_S", "900"))

    began = time.monotonic()
    run = cloud.json("POST", "/api/v1/runs", config)
    create_s = time.monotonic() - began
    run_id = run["run_id"]
    # As the cloud made it: a selection's sites resolved to edge ids, the topology sized to them.
    selection = run["config"].get("selection")
    num_edges = run["config"]["topology"]["num_edges"]
    if selection:
        edges = set(selection["edge_ids"])
        expected = {int(k) for k in env["FL_DEVICES"].split(",")}
        members = f"devices {sorted(expected)}"
    else:
        edges = set(range(num_edges))
        expected = None
        members = f"{run['config']['data']['num_clients']} clients"
    print(f"deploy-run: created {run_id} in {create_s:.1f} s ({config['algorithm']}, {rounds} rounds, "
          f"{num_edges} edges, {members})", flush=True)
    cloud.call("POST", f"/api/v1/runs/{run_id}/start")
    started = time.monotonic()
    seen = 0
    while True:
        info = cloud.json("GET", f"/api/v1/runs/{run_id}")
        last = info.get("last_round")
        if info["version"] > seen and last:
            seen = info["version"]
            # null until the cloud has evaluated the round's model (evaluation runs off the critical path)
            evaluated = last["test_accuracy"] is not None
            figures = f"accuracy {last['test_accuracy']:.4f}" if evaluated else "not evaluated"
            print(f"deploy-run: version {seen}/{rounds}: {figures}, {time.monotonic() - started:.1f} s", flush=True)
        if info["status"] in ("finished", "stopped"):
            break
        if time.monotonic() > deadline:
            print(f"deploy-run: FAIL: still {info['status']} at version {info['version']}/{rounds} after "
                  f"{time.monotonic() - began:.0f} s", flush=True)
            return 1
        time.sleep(1)
    train_s = time.monotonic() - started

    history = cloud.json("GET", f"/api/v1/runs/{run_id}/history")
    _, model, headers = cloud.call("GET", f"/api/v1/runs/{run_id}/model")
    accuracy = history[-1]["test_accuracy"] if history and history[-1]["test_accuracy"] is not None else float("nan")
    failures = []
    if info["status"] != "finished":
        failures.append(f"status {info['status']}, not finished")
    if len(history) != rounds:
        failures.append(f"{len(history)} rounds in the history, not {rounds}")
    numbers = [r["round"] for r in history]
    if numbers and numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        failures.append(f"rounds not numbered in turn: {numbers}")
    if [r["version"] for r in history] != list(range(1, len(history) + 1)):
        failures.append(f"versions {[r['version'] for r in history]}")
    clients = run["config"]["data"]["num_clients"]
    for r in history:
        if set(r["edges"]) != edges:
            failures.append(f"round {r['round']}: edges {r['edges']}, not {sorted(edges)}")
        trained = {c["client_id"] for c in r["clients"]}
        if expected is not None and trained != expected:
            failures.append(f"round {r['round']}: devices {sorted(trained)}, not {sorted(expected)}")
        if expected is None and config.get("fraction", 1.0) == 1.0 and len(r["clients"]) != clients:
            failures.append(f"round {r['round']}: {len(r['clients'])} clients, not {clients}")
        if run["config"].get("evaluation", "cloud") != "cloud":
            # The devices evaluated the version the round started from on their held-out splits, each site its own.
            evaluated = [f for f in r.get("federated", []) if f["version"] == r["round"]]
            if not evaluated or {s["edge_id"] for s in evaluated[0]["sites"]} != edges \
                    or any(c.get("evaluation") is None for c in r["clients"]):
                failures.append(f"round {r['round']}: federated evaluation {r.get('federated')}")
        if r.get("failed_clients"):
            failures.append(f"round {r['round']}: failed clients {r['failed_clients']}")
    version = {k.lower(): v for k, v in headers.items()}.get("x-fl-version")
    if version != str(rounds):
        failures.append(f"model download at version {version}, not {rounds}")
    if not accuracy >= floor:
        failures.append(f"accuracy {accuracy:.4f} below the floor {floor}")
    federated = history[-1].get("federated") if history else None
    summary = {"run_id": run_id, "status": info["status"], "rounds": len(history), "accuracy": accuracy,
               **({"federated_accuracy": federated[0]["accuracy"]} if federated else {}),
               "floor": floor, "create_s": round(create_s, 2), "train_s": round(train_s, 1),
               "model_bytes": len(model), "ok": not failures}
    for failure in failures:
        print(f"deploy-run: FAIL: {failure}", flush=True)
    print(json.dumps(summary), flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
