import httpx
import pytest

from fl_services.fedctl.api import CloudAPI

RUN = {"run_id": "r", "status": "running", "version": 1, "rounds": 3, "buffered": 0,
       "created_at": "2026-11-22T00:00:00Z",
       "config": {"name": "x", "model": {"name": "logreg"}, "data": {"dataset": "digits", "num_clients": 4}}}


def api_answering(*answers) -> tuple[CloudAPI, list[str]]:
    """A CloudAPI whose requests get `answers` in turn: a status code, or an exception to raise."""
    seen, queue = [], list(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer, json=RUN if answer == 200 else {"detail": "x"})

    api = CloudAPI("http://cloud", "t", transport=httpx.MockTransport(handle), read_attempts=4)
    return api, seen


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The waits between attempts, not waited."""
    waited: list[float] = []
    monkeypatch.setattr("fl_services.shared.wire.retry.time.sleep", waited.append)
    return waited


def test_reads_go_through_a_passing_fault(sleeps):
    api, seen = api_answering(500, httpx.ConnectError("reset"), 200)
    assert api.run("r").version == 1
    assert seen == ["GET /api/v1/runs/r"] * 3
    assert sleeps == [0.2, 0.4]


def test_client_errors_and_lasting_faults_are_not_retried_forever(sleeps):
    api, seen = api_answering(404)
    with pytest.raises(RuntimeError, match="404"):
        api.run("r")
    assert len(seen) == 1
    api, seen = api_answering(500, 500, 500, 500)
    with pytest.raises(RuntimeError, match="500"):
        api.run("r")
    assert len(seen) == 4
    assert sleeps == [0.2, 0.4, 0.8]


def test_writes_are_sent_once(sleeps):
    api, seen = api_answering(500)
    with pytest.raises(RuntimeError, match="500"):
        api.action("r", "stop")
    assert seen == ["POST /api/v1/runs/r/stop"]
    api, seen = api_answering(httpx.ConnectError("reset"))
    with pytest.raises(httpx.ConnectError):
        api.action("r", "stop")
    assert seen == ["POST /api/v1/runs/r/stop"] and sleeps == []


def test_a_run_id_is_one_path_segment():
    """An id typed as "../../x" reached another route (POST /api/x/start) with the admin token."""
    sent: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.method} {request.url.raw_path.decode()}")
        return httpx.Response(404, json={"detail": "unknown run"})

    api = CloudAPI("http://cloud", "t", transport=httpx.MockTransport(handle), read_attempts=1)
    for call in (lambda: api.action("../../x", "start"), lambda: api.delete_run("../x"), lambda: api.run("a/b")):
        with pytest.raises(RuntimeError):
            call()
    assert sent == ["POST /api/v1/runs/..%2F..%2Fx/start", "DELETE /api/v1/runs/..%2Fx", "GET /api/v1/runs/a%2Fb"]
