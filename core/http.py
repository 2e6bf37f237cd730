"""HTTP for served members: one deadline per request, a cap on every answer, TLS as asked.

httpx's timeouts bound each network operation (connecting, one read, one write), so a server
that sends a byte every few seconds never times out, and an answer is as large as the server
makes it. Requests here run on one background event loop, shared by every served member, under
`asyncio.wait_for`: the deadline bounds connecting, sending and every read together, and the
request is cancelled cleanly when it passes. The answer is read in chunks and given up on as
soon as it outgrows its cap (a declared Content-Length over the cap fails before any reading).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
from collections.abc import Coroutine
from typing import Any

import httpx

from .errors import InvalidConfigError

_loop: tuple[int, asyncio.AbstractEventLoop] | None = None  # (process id, loop)
_loop_lock = threading.Lock()


class AnswerTooLarge(Exception):
    """The server's answer is over the cap the request allowed (the message gives both)."""


def _background_loop() -> asyncio.AbstractEventLoop:
    """The event loop every client runs its requests on (one daemon thread per process)."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():  # a forked child has no loop thread
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="served-members", daemon=True)
            thread.start()
            _loop = (os.getpid(), loop)
        return _loop[1]


def tls_context(verify: bool | str, cert: str | tuple[str, str] | None) -> ssl.SSLContext:
    """The TLS settings of a served member: `verify` True (the system's or certifi's CAs, as
    httpx picks them), False (no check), or a CA bundle file or directory; `cert` a PEM file
    holding a client certificate and its key, or a (certificate, key) pair of files."""
    if isinstance(verify, bool):
        context = httpx.create_ssl_context(verify=verify)
    else:
        path = os.fspath(verify)
        if not os.path.exists(path):
            raise InvalidConfigError(
                f"Remote verify={path!r}: no such file or directory; pass True (the system's "
                "CAs), False (no check) or the path of a CA bundle (PEM)."
            )
        try:
            if os.path.isdir(path):
                context = ssl.create_default_context(capath=path)
            else:
                context = ssl.create_default_context(cafile=path)
        except ssl.SSLError as error:
            raise InvalidConfigError(
                f"Remote verify={path!r} is not a CA bundle in PEM format ({error})."
            ) from None
    if cert is not None:
        files = (cert,) if isinstance(cert, str) else tuple(cert)
        for file in files:
            if not os.path.isfile(file):
                raise InvalidConfigError(
                    f"Remote cert: {file!r} is not a file; pass the client certificate's PEM "
                    "file (holding its key), or a (certificate, key) pair of PEM files."
                )
        try:
            context.load_cert_chain(*files)
        except ssl.SSLError as error:
            raise InvalidConfigError(
                f"Remote cert={cert!r} is not a client certificate with its private key in PEM "
                f"format ({error})."
            ) from None
    return context


class Client:
    """One served member's connection pool; `request` is called from any thread."""

    def __init__(
        self,
        *,
        headers: dict[str, str],
        auth: tuple[str, str] | None,
        verify: ssl.SSLContext,
    ) -> None:
        self._loop = _background_loop()

        async def make() -> httpx.AsyncClient:  # made on the loop that will use it
            return httpx.AsyncClient(headers=headers, auth=auth, verify=verify, timeout=None)

        self._client = self._run(make())

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # the caller gave up (an interrupt): so does the request
            raise

    def request(
        self, method: str, url: str, *, json: Any = None, timeout: float, limit: int
    ) -> tuple[int, bytes]:
        """(status, body). Raises `TimeoutError` when the whole exchange takes longer than
        `timeout` seconds, `AnswerTooLarge` past `limit` bytes, httpx's errors otherwise."""
        return self._run(self._send(method, url, json, timeout, limit))

    async def _send(
        self, method: str, url: str, json: Any, timeout: float, limit: int
    ) -> tuple[int, bytes]:
        try:
            return await asyncio.wait_for(self._exchange(method, url, json, limit), timeout)
        except asyncio.TimeoutError:  # (the builtin TimeoutError itself from Python 3.11 on)
            raise TimeoutError(f"no whole answer within {timeout:g} s") from None
        except ssl.SSLError as error:
            # A server that refuses the TLS session (no client certificate, say) is seen during
            # the handshake (httpx's ConnectError) or, with TLS 1.3, at the first read, where
            # httpx lets the raw error through: the same refusal gets the same error either way.
            raise httpx.ConnectError(f"TLS: {error}") from error

    async def _exchange(self, method: str, url: str, json: Any, limit: int) -> tuple[int, bytes]:
        async with self._client.stream(method, url, json=json) as response:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise AnswerTooLarge(f"an answer of {int(declared):,} bytes (cap {limit:,})")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > limit:
                    raise AnswerTooLarge(f"an answer over {limit:,} bytes (the cap)")
            return response.status_code, bytes(body)

    def close(self) -> None:
        if not self._loop.is_closed() and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(5)
