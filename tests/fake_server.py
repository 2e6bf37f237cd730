"""A tiny in-process stand-in for a vLLM server, for the remote-member tests of the main suite.

It answers the slice of vLLM's API that `core.remote` uses (`/v1/models`, `/tokenize`, `/health`,
`/v1/completions` with token-id prompts, several prompts per request, `logprobs` incl. -1,
`prompt_logprobs`, `logprob_token_ids`, `return_token_ids`, `return_tokens_as_token_ids`,
greedy and seeded sampling, `stop_token_ids`), computed by an in-process Hugging Face model
WITHOUT a KV cache (so its numbers differ from an in-process member's in the last bits, as a
real server's do). Faults can be injected: dropped connections, 503s, slow answers, answers held
back until the test lets them go (`gate`), a stop and a restart on the same port, and answers a
faulty or hostile server could give (`CORRUPTIONS`: NaN or positive log-probs, ids outside the
vocabulary, more tokens than asked, bodies that are not JSON or not shaped as asked, huge bodies,
bodies trickled a byte at a time). `spans` records when each completion request arrived and was
answered, for tests that need the order of events. `api_key` makes it refuse requests without
that bearer token (as vLLM's `--api-key` does); `tls` serves HTTPS with an `ssl.SSLContext`.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from core.loading import load_model, load_tokenizer


class FakeServer:
    def __init__(
        self,
        model_dir,
        name: str = "m",
        *,
        tokenizer_dir=None,
        max_model_len: int = 2048,
        max_logprobs: int = -1,
        delay: float = 0.0,
        api_key: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.model = load_model(str(model_dir), torch.device("cpu"), torch.float32)
        self.tokenizer = load_tokenizer(str(tokenizer_dir or model_dir))
        self.name, self.root = name, str(model_dir)
        self.max_model_len, self.max_logprobs, self.delay = max_model_len, max_logprobs, delay
        self.api_key, self.tls = api_key, tls
        self.authorizations: list[str | None] = []  # the Authorization header of each request
        self.models_answer: bytes | None = None  # set: /v1/models answers these bytes instead
        self.trickle = 0.4  # seconds between the bytes of a trickled answer
        self.trickle_bytes = 20  # ... which stops (the connection cut) after this many bytes
        self.trickle_total = 0.0  # seconds the last trickle lasts when the client waits it out
        self.huge = 16 * 2**20  # bytes of padding in a "huge" answer
        self.vocab = self.model.config.get_text_config().vocab_size
        self.counts: Counter[str] = Counter()
        self.bodies: list[dict] = []
        self.faults: list[str] = []  # one per completion request: "drop", "503", a corruption
        self.gate = threading.Event()  # cleared: completion requests wait here (a stuck server)
        self.gate.set()
        self.held = threading.Event()  # set when a request starts waiting at the closed gate
        self.spans: list[tuple[float, float]] = []  # (arrived, answered) per completion request
        self.port = 0
        self._httpd: ThreadingHTTPServer | None = None
        self.connections: set = set()  # open sockets: a stop cuts them, as a dying server does
        self.start()

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        server = self
        handler = type("Handler", (_Handler,), {"server_ref": server})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        if self.tls is not None:
            self._httpd.socket = self.tls.wrap_socket(self._httpd.socket, server_side=True)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        for connection in list(self.connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- the model -----------------------------------------------------------------------------

    def rows(self, ids: list[int]) -> torch.Tensor:
        """Log-probs after every prefix of ids: rows[i] predicts ids[i + 1]."""
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits, -1)

    def complete(self, body: dict) -> dict:
        prompts = body["prompt"]
        if not prompts or not isinstance(prompts, list):
            raise _BadRequest("prompt must be a list of token ids")
        if isinstance(prompts[0], int):
            prompts = [prompts]
        for key, value in (
            ("sample", body.get("logprobs")),
            ("prompt", body.get("prompt_logprobs")),
        ):
            wanted = self.vocab if value == -1 else (value or 0)
            cap = self.vocab if self.max_logprobs == -1 else self.max_logprobs
            if wanted > cap:
                raise _BadRequest(
                    f"Requested {key} logprobs of {wanted}, which is greater than max allowed: "
                    f"{cap}"
                )
        choices = [self._choice(i, list(p), body) for i, p in enumerate(prompts)]
        return {"object": "text_completion", "model": self.name, "choices": choices}

    def _choice(self, index: int, prompt: list[int], body: dict) -> dict:
        if any(not 0 <= t < self.vocab for t in prompt):
            raise _BadRequest("Token id out of vocabulary")
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise _BadRequest(f"prompt of {len(prompt)} tokens is too long")
        n = min(body.get("max_tokens") or 16, room)
        stops = set(body.get("stop_token_ids") or [])
        temperature = body.get("temperature", 1.0)
        generator = torch.Generator().manual_seed(body["seed"]) if "seed" in body else None
        seq, out, tops, finish = list(prompt), [], [], "length"
        k = body.get("logprobs")
        for _ in range(n):
            row = self.rows(seq)[-1]
            if temperature == 0:
                token = int(torch.argmax(row))
            else:
                probs = _top_p(torch.softmax(row / temperature, -1), body.get("top_p", 1.0))
                token = int(torch.multinomial(probs, 1, generator=generator))
            if k is not None:
                tops.append(self._entries(row, token, k, body.get("logprob_token_ids")))
            seq.append(token)
            out.append(token)
            if token in stops:
                finish = "stop"
                break
        choice = {"index": index, "text": "", "finish_reason": finish, "logprobs": None}
        if k is not None:
            choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in out], "top_logprobs": tops}
        if body.get("return_token_ids"):
            choice["token_ids"], choice["prompt_token_ids"] = out, prompt
        pk = body.get("prompt_logprobs")
        if pk is not None:
            rows = self.rows(prompt)
            plp = [None]
            for i in range(1, len(prompt)):
                entries = {prompt[i]: float(rows[i - 1, prompt[i]])}
                if pk:
                    top = rows[i - 1].topk(self.vocab if pk == -1 else pk)
                    entries.update(zip(top.indices.tolist(), top.values.tolist(), strict=True))
                plp.append({str(t): {"logprob": v, "rank": 1} for t, v in entries.items()})
            choice["prompt_logprobs"] = plp
        return choice

    def _entries(self, row: torch.Tensor, token: int, k: int, only) -> dict[str, float]:
        if only:
            ids = [token, *only]
        else:
            top = row.topk(self.vocab if k == -1 else max(k, 0))
            ids = [token, *top.indices.tolist()]
        return {f"token_id:{i}": float(row[i]) for i in ids}


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return probs
    values, order = torch.sort(probs, descending=True)
    keep = torch.cumsum(values, 0) - values < top_p
    mask = torch.zeros_like(probs, dtype=torch.bool)
    mask[order[keep]] = True
    return torch.where(mask, probs, torch.zeros_like(probs))


class _BadRequest(Exception):
    pass


# What a faulty or hostile server may answer to a completion request (see `corrupt`).
CORRUPTIONS = (
    "nan",  # NaN log-probs
    "positive",  # log-probs above 0
    "negative_id",  # a token id of -1
    "big_id",  # a token id past the vocabulary
    "extra_tokens",  # more generated tokens than max_tokens
    "not_json",  # an HTML error page with status 200
    "no_choices",  # JSON without its choices
    "huge",  # a valid answer padded past any cap, its size declared
    "huge_undeclared",  # the same without a Content-Length: read until the server closes
    "trickle",  # a valid answer whose body comes one byte every `trickle` seconds
    "trickle_head",  # the same from the status line on
)


def corrupt(answer: dict, fault: str, body: dict, vocab: int, huge: int) -> dict | bytes:
    """`answer` (a completion) as a faulty server would give it."""
    if fault == "not_json":
        return b"<html><body>Internal error</body></html>"
    if fault == "no_choices":
        return {"object": "text_completion", "model": answer["model"]}
    if fault.startswith("huge"):
        return {**answer, "padding": "x" * huge}
    too_many = (body.get("max_tokens") or 16) + 1
    for choice in answer["choices"]:
        rows = (choice.get("logprobs") or {}).get("top_logprobs") or []
        ids = choice.get("token_ids")
        if fault in ("nan", "positive"):
            value = math.nan if fault == "nan" else 0.5
            for row in rows:
                row[next(iter(row))] = value
            for entries in (choice.get("prompt_logprobs") or [])[1:]:
                for entry in entries.values():
                    entry["logprob"] = value
        elif fault in ("negative_id", "big_id"):
            bad = -1 if fault == "negative_id" else vocab + 7
            for row in rows:
                row[f"token_id:{bad}"] = row.pop(next(iter(row)))
            if ids:
                ids[0] = bad
        elif fault == "extra_tokens":
            rows.extend(dict(rows[-1]) for _ in range(too_many - len(rows)) if rows)
            if ids is not None:
                ids.extend([ids[-1] if ids else 0] * (too_many - len(ids)))
    return answer


def make_tls_files(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the
    CA (PEM files, made with the openssl command line). Keys: ca, server, server_key, client,
    client_key."""
    names = ("ca", "ca_key", "server", "server_key", "client", "client_key")
    files = {name: directory / f"{name}.pem" for name in names}

    def openssl(*args: str | Path) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)

    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca = ["-CA", files["ca"], "-CAkey", files["ca_key"], "-CAcreateserial", "-days", "2"]
    openssl("req", "-x509", *new_key, "-keyout", files["ca_key"], "-out", files["ca"],
            "-subj", "/CN=test CA", "-days", "2")  # fmt: skip
    uses = {"server": "subjectAltName=IP:127.0.0.1", "client": "extendedKeyUsage=clientAuth"}
    for who, extension in uses.items():
        request, extensions = directory / f"{who}.csr", directory / f"{who}.ext"
        extensions.write_text(extension + "\n")
        openssl("req", "-new", *new_key, "-keyout", files[f"{who}_key"], "-out", request,
                "-subj", f"/CN={who}")  # fmt: skip
        openssl("x509", "-req", "-in", request, *ca, "-out", files[who], "-extfile", extensions)
    return files


class _Handler(BaseHTTPRequestHandler):
    server_ref: FakeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        # headers and body go out in two writes: without this, each answer waits for the
        # client's delayed ACK (~40 ms), as a real server's does not
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server_ref.connections.add(self.connection)

    def finish(self) -> None:
        self.server_ref.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def _send(self, status: int, data: dict | bytes, fault: str | None = None) -> None:
        payload = data if isinstance(data, bytes) else json.dumps(data).encode()
        if fault not in ("trickle", "trickle_head", "huge_undeclared"):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.close_connection = True
        length = "" if fault == "huge_undeclared" else f"Content-Length: {len(payload)}\r\n"
        head = f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n{length}\r\n"
        if fault == "huge_undeclared":
            with contextlib.suppress(OSError):
                self.wfile.write(head.encode() + payload)
            return
        fake = self.server_ref
        slow = payload if fault == "trickle" else head.encode() + payload
        slow = slow[: fake.trickle_bytes]  # then the server goes: a client that waits, fails
        fake.trickle_total = len(slow) * fake.trickle
        with contextlib.suppress(OSError):  # the client gave up: the connection is gone
            if fault == "trickle":
                self.wfile.write(head.encode())
            for i in range(len(slow)):
                self.wfile.write(slow[i : i + 1])
                time.sleep(fake.trickle)

    def _authorized(self) -> bool:
        """As vLLM's --api-key: a request without the key is refused (and the refusal quotes
        what came, to check that the client scrubs it)."""
        fake = self.server_ref
        given = self.headers.get("Authorization")
        fake.authorizations.append(given)
        if fake.api_key is None or given == f"Bearer {fake.api_key}":
            return True
        detail = "Unauthorized: the header " + repr(given) + " is not the key. " + "-" * 2000
        self._send(401, {"error": {"message": detail, "code": 401}})
        return False

    def do_GET(self) -> None:
        fake = self.server_ref
        fake.counts[self.path] += 1
        if self.path == "/health":
            self._send(200, {})
        elif not self._authorized():
            return
        elif self.path == "/v1/models" and fake.models_answer is not None:
            self._send(200, fake.models_answer)
        elif self.path == "/v1/models":
            entry = {"id": fake.name, "root": fake.root, "max_model_len": fake.max_model_len}
            self._send(200, {"object": "list", "data": [entry]})
        else:
            self._send(404, {"error": {"message": "Not Found"}})

    def do_POST(self) -> None:
        fake = self.server_ref
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        fake.counts[self.path] += 1
        if not self._authorized():
            return
        try:
            if body.get("model") != fake.name:
                self._send(404, {"error": {"message": f"The model `{body.get('model')}` "
                                           f"does not exist."}})  # fmt: skip
            elif self.path == "/tokenize":
                tokens = fake.tokenizer(body["prompt"], add_special_tokens=False)["input_ids"]
                self._send(200, {"tokens": tokens, "count": len(tokens)})
            elif self.path == "/v1/completions":
                fault = fake.faults.pop(0) if fake.faults else None
                if fault == "drop":  # the server dies mid-request: no answer at all
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if fault == "503":
                    self._send(503, {"error": {"message": "starting"}})
                    return
                arrived = time.perf_counter()
                if not fake.gate.is_set():
                    fake.held.set()
                    fake.gate.wait()
                time.sleep(fake.delay)
                fake.bodies.append(body)
                answer = _finite(fake.complete(body))
                if fault in CORRUPTIONS:
                    answer = corrupt(answer, fault, body, fake.vocab, fake.huge)
                fake.spans.append((arrived, time.perf_counter()))
                self._send(200, answer, fault)
            else:
                self._send(404, {"error": {"message": "Not Found"}})
        except _BadRequest as error:
            self._send(400, {"error": {"message": str(error), "code": 400}})


def _finite(data):
    """vLLM writes -inf log-probs as -9999.0 (JSON has no infinities)."""
    if isinstance(data, float):
        return -9999.0 if math.isinf(data) else data
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_finite(v) for v in data]
    return data
