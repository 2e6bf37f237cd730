"""A real server on a free loopback port, in a thread of the test process, over a given
ensemble (the tests compare its answers with the same ensemble called in process)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from core.serve.runner import build
from core.serve.settings import ServeSettings


@contextlib.contextmanager
def running_server(load, **settings) -> Iterator[tuple[str, object]]:
    """Yields the server's base URL (".../v1" not included) and its app."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings.setdefault("log_level", "warning")
    server, app = build(ServeSettings(port=port, **settings), load=load)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (server.started and app.lifecycle.phase != "loading"):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
