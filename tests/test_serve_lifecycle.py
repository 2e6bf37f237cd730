"""The server as a process: configuration from a file and flags, refusing an open address
without a key, loading before ready, and SIGTERM: stop accepting, let the request in flight
finish (or cut it at the grace period), exit 0, the key never in the log."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from core.cli import main
from core.errors import InvalidConfigError
from core.remote import Remote
from core.serve.settings import API_KEY_ENV, build_settings, read_config
from core.sources import model_sources
from core.testbed import make_problems, model_paths

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-lifecycle-secret-0123"


def test_a_config_file_with_flags_over_it(tmp_path):
    config = tmp_path / "ensemble.toml"
    config.write_text(
        'method = "specem"\n'
        'members = ["a/model", {base_url = "http://127.0.0.1:8011/v1", model = "m", '
        'tokenizer = "b/tok"}]\n'
        'on_member_failure = "drop"\n'
        "[options]\nlookahead = 4\n"
        '[server]\nport = 9000\nnames = ["ens", "ensemble"]\n'
        "[limits]\nmax_tokens = 128\n"
    )
    keys = tmp_path / "keys"
    keys.write_text("# one per line\nk-one\nk-two\n")
    settings = build_settings(
        read_config(str(config)),
        ensemble={"method": None, "max_concurrency": 4},
        server={"port": 9100, "api_key_file": str(keys)},
        api_keys=["k-three"],
        environ={API_KEY_ENV: "k-four,k-one"},
    )
    assert settings.port == 9100 and settings.names == ("ens", "ensemble")
    assert settings.ensemble.method == "specem" and settings.ensemble.max_concurrency == 4
    assert settings.ensemble.options == {"lookahead": 4}
    assert settings.limits.max_tokens == 128 and settings.limits.max_messages == 512
    assert settings.api_keys == ("k-three", "k-one", "k-two", "k-four")
    assert "k-one" not in repr(settings)
    local, remote = model_sources(list(settings.ensemble.members))
    assert local == "a/model" and remote == Remote(
        base_url="http://127.0.0.1:8011/v1", model="m", tokenizer="b/tok"
    )


def test_a_server_loads_the_weights_calibration_saved(tmp_path, tiny_members):
    from core import Ensemble

    calibrated = Ensemble(tiny_members[:2], "rerank")
    calibrated.calibrate(["What is 2 + 3?", "Tom has 4 apples. He eats 1."], max_new_tokens=24)
    assert calibrated.summary()["self_preference"] is not None  # the members disagreed
    path = calibrated.save_weights(tmp_path / "trust.json")
    paths = [str(p) for p in model_paths()[:2]]
    config = tmp_path / "ensemble.toml"
    config.write_text(f'method = "rerank"\nmembers = {json.dumps(paths)}\n')
    settings = build_settings(read_config(str(config)), ensemble={"weights": str(path)})
    served = settings.ensemble.load()
    assert served.member_weights == pytest.approx(calibrated.member_weights)
    assert served.summary()["self_preference"] == calibrated.summary()["self_preference"]
    assert served.learn_weights is False  # frozen: an answer depends on its request alone
    config.write_text(f"weights = 3\nmembers = {json.dumps(paths)}\n")
    with pytest.raises(InvalidConfigError, match="weights must be the path"):
        build_settings(read_config(str(config)))


@pytest.mark.parametrize(
    "text, problem",
    [
        ('methd = "safe"\n', "unknown key(s) methd"),
        ("[server]\nhots = 1\n", "unknown key(s) hots in the [server]"),
        ("method = \n", "not valid TOML"),
    ],
)
def test_a_bad_config_file_is_named(tmp_path, text, problem):
    config = tmp_path / "ensemble.toml"
    config.write_text(text)
    with pytest.raises(InvalidConfigError) as raised:
        read_config(str(config))
    assert problem in str(raised.value)


@pytest.mark.parametrize(
    "text", ["", "# keys go here\n\n  # none yet\n"], ids=["empty", "comments"]
)
def test_a_key_file_without_keys_refuses_to_start(tmp_path, capsys, monkeypatch, text):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    keys = tmp_path / "keys"
    keys.write_text(text)
    assert main(["serve", "--api-key-file", str(keys), "--model", "x"]) == 2
    assert "holds no key (it is empty or all comments)" in capsys.readouterr().err


def test_an_open_address_without_a_key_is_refused(capsys, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--model", "x"]) == 2
    assert "refusing to listen on '0.0.0.0' without an API key" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(tmp_path: Path, grace: float) -> tuple[subprocess.Popen, str, Path]:
    port = _free_port()
    keys = tmp_path / "keys"
    keys.write_text(KEY + "\n")
    log = tmp_path / "server.log"
    members = [arg for path in model_paths() for arg in ("--model", str(path))]
    command = [sys.executable, "-m", "core.cli", "serve", *members, "--port", str(port),
               "--api-key-file", str(keys), "--grace", str(grace), "--device", "cpu",
               "--threads", "1"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return process, url, log
        except httpx.TransportError:
            pass
        time.sleep(0.05)


@pytest.mark.parametrize("grace", [60.0, 0.2], ids=["finishes", "cut-at-grace"])
def test_sigterm_drains_then_exits_zero(tmp_path, grace):
    process, url, log = _start(tmp_path, grace)
    lines: list[str] = []
    started = threading.Event()
    body = {
        "model": "ensemble",
        "messages": make_problems(1, seed=2)[0].messages,
        "max_tokens": 120,
        "response_format": {"type": "json_object"},  # writes on: a long request
        "stream": True,
    }

    def stream() -> None:
        headers = {"authorization": f"Bearer {KEY}"}
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                              headers=headers, timeout=120) as response:  # fmt: skip
                for line in response.iter_lines():
                    lines.append(line)
                    started.set()
        except httpx.TransportError:
            pass  # cut at the grace period
        started.set()

    client = threading.Thread(target=stream)
    try:
        client.start()
        assert started.wait(60)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, log.read_text()
        client.join(60)
    finally:
        if process.poll() is None:
            process.kill()
    with pytest.raises(httpx.TransportError):  # nothing listens any more
        httpx.get(url + "/health", timeout=5)
    events = [line[6:] for line in lines if line.startswith("data: ")]
    if grace > 30:  # the request ran to its end
        assert events[-1] == "[DONE]"
        finish = [json.loads(e) for e in events[:-1] if '"finish_reason": "' in e]
        assert finish[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    else:  # cut: no end of stream
        assert "[DONE]" not in events
    text = log.read_text()
    assert "draining" in text and KEY not in text
