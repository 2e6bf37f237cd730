"""What a careless or hostile client gets from `llm-ensembling serve`: its request's own work
bounded by the queue, its slot freed when it leaves the queue, slow headers and bodies cut,
its key never logged from a query string, a failed load's paths and a member server's URL and
credentials never shown, and its own bad sampling values never blamed on a member."""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
import threading
import time

import httpx
import pytest
from fake_server import FakeServer
from serve_helpers import running_server

from core import Ensemble
from core.remote import Remote
from core.testbed import make_problems, model_paths

PROBLEM = make_problems(1, seed=4)[0]
CHAT = "/v1/chat/completions"
UNENFORCEABLE = {  # a tool the grammar compiler refuses: a 422 once the request is translated
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"xs": {"uniqueItems": True}}},
    },
}


def _body(**changes) -> dict:
    return {"model": "ensemble", "messages": PROBLEM.messages, "max_tokens": 8, **changes}


@contextlib.contextmanager
def _slot_held(url: str, ensemble: Ensemble):
    """The one slot held by a streaming request that writes until the block ends."""
    hook = ensemble.members[0].model.register_forward_pre_hook(lambda *_: time.sleep(0.02))
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        body = _body(max_tokens=400, stream=True, response_format={"type": "json_object"})
        with httpx.stream("POST", url + CHAT, json=body, timeout=60) as response:
            for _ in response.iter_lines():
                holding.set()
                if release.is_set():
                    break

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        assert holding.wait(60)
        yield
    finally:
        release.set()
        thread.join(60)
        hook.remove()
        ensemble.admission.wait_until(lambda: ensemble.admission.running == 0, 60)


@pytest.fixture(scope="module")
def one_slot(shipped_members):
    """A server whose ensemble runs one request and queues one more."""
    ensemble = Ensemble(list(shipped_members[:1]), "single", max_concurrency=1, max_queue=1)
    with running_server(lambda: ensemble) as (url, _):
        yield url, ensemble


def test_a_request_is_read_and_compiled_only_once_it_holds_a_slot(one_slot):
    url, ensemble = one_slot
    answers: list[httpx.Response] = []
    with _slot_held(url, ensemble):
        waiting = threading.Thread(
            target=lambda: answers.append(
                httpx.post(url + CHAT, json=_body(tools=[UNENFORCEABLE]), timeout=60)
            )
        )
        waiting.start()
        # its schema is not compiled yet: the request waits in the queue for its slot...
        assert ensemble.admission.wait_until(lambda: ensemble.admission.waiting == 1, 30)
        # ...where it counts: a third request finds the queue full, whatever its body
        third = httpx.post(url + CHAT, json=_body(tools=[UNENFORCEABLE]), timeout=60)
        assert third.status_code == 429 and third.json()["error"]["code"] == "queue_full"
    waiting.join(60)
    assert answers[0].status_code == 422 and "uniqueItems" in answers[0].json()["error"]["message"]


def test_a_client_that_leaves_the_queue_frees_its_place(one_slot):
    url, ensemble = one_slot
    with _slot_held(url, ensemble):
        with pytest.raises(httpx.ReadTimeout):  # queued, then gone
            httpx.post(url + CHAT, json=_body(), timeout=2)
        # its place is free long before queue_timeout (60 s): the next one queues, no 429
        assert ensemble.admission.wait_until(lambda: ensemble.admission.waiting == 0, 20)
        answers: list[httpx.Response] = []
        late = threading.Thread(
            target=lambda: answers.append(httpx.post(url + CHAT, json=_body(), timeout=60))
        )
        late.start()
        assert ensemble.admission.wait_until(lambda: ensemble.admission.waiting == 1, 30)
    late.join(60)
    assert answers[0].status_code == 200


@pytest.fixture(scope="module")
def strict(shipped_members):
    """A server with a key, short read timeouts, and its access log at info."""
    ensemble = Ensemble(list(shipped_members[:1]), "single")
    settings = {"api_keys": ("sk-strict-0123",), "header_timeout": 0.5, "body_timeout": 0.5}
    with running_server(lambda: ensemble, log_level="info", **settings) as (url, _):
        yield url


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=20)
    return sock


def test_slow_headers_and_slow_bodies_are_cut(strict):
    with _connect(strict) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
        assert sock.recv(1024) == b""  # closed by the server, long before the 20 s guard
    with _connect(strict) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer sk-strict-0123\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": '
        )
        answer = b"".join(iter(lambda: sock.recv(4096), b""))  # to the server's close
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer


def test_a_key_in_the_query_string_is_never_logged(strict):
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    access = logging.getLogger("uvicorn.access")
    access.addHandler(handler)
    try:
        answer = httpx.get(strict + "/v1/models?api_key=sk-strict-0123&key=sk-strict-0123")
    finally:
        access.removeHandler(handler)
    assert answer.status_code == 401
    assert any("/v1/models" in line for line in lines)
    assert not any("sk-strict" in line for line in lines)


def test_health_shows_a_failed_load_only_to_a_key_holder(shipped_members):
    key = "sk-health-0123"
    ensemble = Ensemble(list(shipped_members[:1]), "single")
    with running_server(lambda: ensemble, api_keys=(key,)) as (url, app):
        app.lifecycle.phase = "failed"  # as a failed load leaves it, until the server stops
        app.lifecycle.error = "OSError: no model at /srv/private/models/secret-name"
        anonymous = httpx.get(url + "/health")
        holder = httpx.get(url + "/health", headers={"authorization": f"Bearer {key}"})
    assert anonymous.status_code == holder.status_code == 503
    assert anonymous.json() == {"status": "failed"}
    assert "/srv/private" in holder.json()["error"]


def test_a_member_servers_failure_shows_neither_its_url_nor_its_credentials():
    password = "pw-0123456789"
    with FakeServer(model_paths()[0]) as fake:
        spec = Remote(
            f"http://alice:{password}@127.0.0.1:{fake.port}/v1", tokenizer=fake.root, retries=0
        )
        ensemble = Ensemble.from_pretrained([spec], "single")
        with running_server(lambda: ensemble) as (url, _):
            fake.api_key = "another"  # now it refuses, echoing the Basic header it got
            answer = httpx.post(url + CHAT, json=_body(), timeout=60)
    token = base64.b64encode(f"alice:{password}".encode()).decode()
    assert answer.status_code == 502
    message = answer.json()["error"]["message"]
    assert "is unavailable" in message and ensemble.members[0].name in message
    for hidden in (token, token.rstrip("="), password, str(fake.port), "Unauthorized"):
        assert hidden not in message


def test_a_tiny_top_p_is_greedy_and_drops_no_member(shipped_members):
    ensemble = Ensemble(list(shipped_members), "safe", on_member_failure="drop")
    with running_server(lambda: ensemble) as (url, _):
        answer = httpx.post(url + CHAT, json=_body(temperature=1.0, top_p=1e-300), timeout=60)
        greedy = httpx.post(url + CHAT, json=_body(), timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["ensemble"]["failed"] == {}
    assert answer.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]
