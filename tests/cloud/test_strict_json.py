"""Every JSON answer of the control API parses with a strict parser: a round the cloud has not evaluated yet
carries null figures (as the OpenAPI schema says), never the NaN or Infinity that JSON does not have."""
from __future__ import annotations

import json
import threading
from typing import Any

import pytest

import fl_services.cloud.orchestrator as orchestrator_module
from fl_services.shared.core.reports import RoundRecord
from tests.cloud.harness import Cloud, contribution, running_run, small_config

pytestmark = pytest.mark.anyio


def strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_the_strict_parser_refuses_nan():
    with pytest.raises(ValueError, match="NaN"):
        strict('{"a": NaN}')


@pytest.fixture
def held_evaluation(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    release = threading.Event()
    evaluate_outcome = orchestrator_module.evaluate_outcome

    def held(*args, **kwargs):
        assert release.wait(30), "the test never released the evaluation"
        return evaluate_outcome(*args, **kwargs)

    monkeypatch.setattr(orchestrator_module, "evaluate_outcome", held)
    return release


async def test_an_unevaluated_round_is_null_in_every_answer(cloud: Cloud, held_evaluation: threading.Event) -> None:
    run_id, _ = await running_run(cloud, small_config(rounds=3))
    global_, _ = await cloud.global_state()
    assert (await cloud.submit(0, contribution(global_, run_id, base_version=0))).status_code == 202
    await cloud.wait_version(run_id, 1)
    try:
        answers = {path: await cloud.admin("GET", path) for path in (
            f"/api/v1/runs/{run_id}", "/api/v1/runs", f"/api/v1/runs/{run_id}/history", f"/api/v1/runs/{run_id}/edges")}
        for path, answer in answers.items():
            assert answer.status_code == 200, (path, answer.text)
            strict(answer.text)
        info = strict(answers[f"/api/v1/runs/{run_id}"].text)
        assert info["last_round"]["test_accuracy"] is None and info["last_round"]["test_loss"] is None
        [record] = strict(answers[f"/api/v1/runs/{run_id}/history"].text)
        assert record["test_accuracy"] is None
        # What reads the history back (fedctl, the dashboard's stream) takes null as "not evaluated".
        assert RoundRecord.model_validate(record).test_accuracy != RoundRecord.model_validate(record).test_accuracy
    finally:
        held_evaluation.set()
    await cloud.wait_evaluated(run_id)
    [record] = strict((await cloud.admin("GET", f"/api/v1/runs/{run_id}/history")).text)
    assert 0 <= record["test_accuracy"] <= 1


async def test_the_schema_says_the_figures_may_be_null(cloud: Cloud) -> None:
    schema = strict((await cloud.http.get("/openapi.json")).text)["components"]["schemas"]["RoundRecord"]
    for name in ("test_loss", "test_accuracy"):
        assert {"type": "null"} in schema["properties"][name]["anyOf"], schema["properties"][name]
