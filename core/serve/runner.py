"""Running the app on uvicorn: listen at once, load the models in the background (`/health`
says ready only when they are), and on SIGTERM or Ctrl-C drain: stop accepting, let requests
in flight finish for up to `grace_seconds` (then cancel them, which frees their slots), exit 0.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator

import uvicorn

from core.ensemble import Ensemble

from .app import EnsembleApp
from .settings import ServeSettings

log = logging.getLogger("llm_ensembling.serve")


class DrainingServer(uvicorn.Server):
    """uvicorn's server, telling the app to drain when a stop signal arrives, and ending
    normally after a drain (uvicorn would re-raise the signal and die by it: a supervisor
    reads that as a crash)."""

    def __init__(self, config: uvicorn.Config, app: EnsembleApp) -> None:
        super().__init__(config)
        self.ensemble_app = app

    def handle_exit(self, sig: int, frame) -> None:
        if not self.should_exit:
            log.info(
                "signal %s: draining (grace %.0f s)", sig, self.config.timeout_graceful_shutdown
            )
        self.ensemble_app.drain()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        stops = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in stops}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def header_deadline(seconds: float) -> type:
    """uvicorn's HTTP protocol (httptools when installed, else h11), closing a connection whose
    next request's headers have not all come `seconds` after it opened or after its last
    answer: uvicorn waits for headers without a limit, so a client trickling them would hold a
    connection open for ever. (The body's own limit is the app's: `--body-timeout`.)"""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:  # pragma: no cover - the serve extra brings httptools
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class HeaderDeadline(base):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._deadline = None
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._before = self.cycle  # a new cycle: the next request's headers are in
            self._deadline = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            idle = self.cycle is None or self.cycle.response_complete  # none being answered
            if idle and self.cycle is self._before and not self.transport.is_closing():
                log.info("closed a connection whose headers took over %g s", seconds)
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._deadline is not None and self.cycle is not self._before:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadline


def build(
    settings: ServeSettings,
    load: Callable[[], Ensemble] | None = None,
) -> tuple[DrainingServer, EnsembleApp]:
    """The server and its app; `load` defaults to loading `settings.ensemble`."""
    holder: dict[str, DrainingServer] = {}

    def failed(_error: BaseException) -> None:
        holder["server"].should_exit = True

    app = EnsembleApp(settings, load or settings.ensemble.load, on_load_failure=failed)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=header_deadline(settings.header_timeout),
        loop="asyncio",
        lifespan="on",
        log_level=settings.log_level,
        timeout_graceful_shutdown=settings.grace_seconds,
        server_header=False,
    )
    holder["server"] = DrainingServer(config, app)
    return holder["server"], app


@contextlib.contextmanager
def serve_in_thread(
    settings: ServeSettings, load: Callable[[], Ensemble], ready: bool = True
) -> Iterator[tuple[str, EnsembleApp]]:
    """A server on a free loopback port, in a thread of this process (a notebook, a test, a
    benchmark that also calls the ensemble in process): yields its base URL and app once it
    listens (and, when `ready`, once `load` returned). `settings.host`/`port` are ignored."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server, app = build(settings, load)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not (server.started and (app.lifecycle.phase != "loading" or not ready)):
        if time.monotonic() > deadline or not thread.is_alive():
            sock.close()
            raise RuntimeError(f"the server did not start ({app.lifecycle.error or 'timeout'})")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


def run(settings: ServeSettings) -> int:
    """Serve until stopped; 0 after a drain, 1 when the models failed to load."""
    settings.check_bind()
    if settings.threads:
        import torch

        torch.set_num_threads(settings.threads)
    _log_like_uvicorn(settings.log_level)
    server, app = build(settings)
    server.run()
    return 1 if app.lifecycle.phase == "failed" else 0


def _log_like_uvicorn(level: str) -> None:
    """The server's lines and the engine's (a self-preference measured while the models load)
    go to stderr as uvicorn's do."""
    library = logging.getLogger("llm_ensembling")
    if not library.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        library.addHandler(handler)
        library.propagate = False
    library.setLevel(level.upper())
