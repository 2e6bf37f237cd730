"""Members served by vLLM: the model lives in a server (another GPU, another machine); the
tokenizer, the chat template and the member's view of the shared text stay here.

A `RemoteMember` is a `Member` like any other: it renders prompts with its own tokenizer, keeps
its own ids of the committed text, and asks its server for distributions. Only token ids
travel (the server never re-tokenizes text), so client and server must agree on the tokenizer:
checked once, when connecting, against vLLM's `/tokenize`.

Every Member operation is ONE request to the OpenAI-compatible `/v1/completions` endpoint, with
vLLM's extensions (token-id prompts, several prompts per request, `prompt_logprobs`,
`return_token_ids`, `return_tokens_as_token_ids`, `logprob_token_ids`):

- `logprobs(boundaries)`: one prompt per boundary (the ids up to it), `max_tokens=1`,
  `logprobs=K`: the one generated position of each prompt carries the next-token distribution.
  (`prompt_logprobs` would send a row for EVERY prompt position, and vLLM reads no prefix cache
  for requests that ask for them.)
- `draft(L)`: `max_tokens=L`, greedy or seeded sampling on the server, the member's stop ids
  as `stop_token_ids`. The distributions behind the drafted tokens are fetched (one more
  request) only if a method reads `Draft.logprobs`: SAFE does, SpecEM and single do not.
- `score(continuations)`: one prompt per continuation with `prompt_logprobs=0` (the log-prob of
  each prompt token: exact whatever K); the log-prob of ending there via `logprob_token_ids`.
- `branch_logprobs`: one prompt per branch (a token-id prompt need not be canonical).

K is the full vocabulary when the server allows it (`--max-logprobs -1`): UniTE's union, GaC and
SAFE's heal read probabilities of tokens outside any top-k, so they match in-process members
exactly only then. With a top-k server the rest of each row shares the leftover probability
evenly; argmaxes (greedy drafting, SAFE's agreement checks) stay exact. Raw logits (SpecEM's
`score="logit"`) are not served.

Nothing is cached here but the last rows asked for: the server's prefix cache
(`--enable-prefix-caching`, on by default in vLLM) is the remote counterpart of the in-process
KV cache.

The server is trusted for its numbers, not for their form: every answer is checked
(`core.vllm_answers`) before it is read, each request has one deadline and a size cap
(`core.http`), and credentials never leave a `Secret` but in the request headers
(`core.credentials`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import httpx
import torch

from . import vllm_answers as answers
from .chat import render_prompt
from .credentials import Secret, scrub, split_userinfo
from .errors import (
    ChatTemplateError,
    InvalidConfigError,
    ModelLoadError,
    ServerError,
    TokenizerMismatchError,
)
from .http import AnswerTooLarge, Client, tls_context
from .kv import common_prefix
from .loading import TOKENIZER_PROBE, load_tokenizer
from .member import Draft, Member, RequestState
from .sampling import Sampler
from .vocab import Vocab, stop_logprob

_RETRYABLE = (  # the server is (re)starting or went away: trying again may help
    httpx.ConnectError,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)
_RETRY_STATUS = (502, 503, 504)
_ENTRY_BYTES = 64  # the most one log-prob entry or token id takes in an answer, with room
T = TypeVar("T")
_MAX_ALLOWED = re.compile(r"max(?:imum)? allowed:?\s*(\d+)")


@dataclass(frozen=True)
class Remote:
    """A member served by vLLM (or another OpenAI-compatible server with vLLM's extensions).

    base_url: the server's OpenAI base, e.g. "http://10.0.0.5:8000/v1" ("/v1" is added when
        the URL has no path). A `user:password@` in it moves to `basic_auth`.
    model: the served model name (`--served-model-name`); None: the server's only model.
    tokenizer: a local directory or hub id of the SAME tokenizer the server uses; None: the path
        the server loaded the model from (works when client and server see the same files).
    name: the member's name in events and stats (default: the last part of the model name).
    top_logprobs: None asks for full-vocabulary distributions when the server allows it
        (`--max-logprobs -1`) and for its cap otherwise; an int asks for that top-k.
    timeout: seconds one request may take in all (connecting, sending, every read); retries:
        attempts after a connection error (0.5 s, 1 s, 2 s, ... apart) before the member is
        reported down.
    check_tokenizer: compare the local tokenizer with the server's `/tokenize` at start.
    api_key: sent as a bearer token (vLLM's `--api-key`); a str or a `SecretStr`, kept in a
        `Secret` (never shown, never pickled).
    verify: True checks the server's TLS certificate against the system's CAs, False does not
        check, a path checks it against that CA bundle (a PEM file or directory).
    cert: a client certificate for servers that ask for one: a PEM file holding the certificate
        and its key, or a (certificate, key) pair of PEM files.
    max_answer_bytes: the largest answer accepted beyond the log-prob rows a request asks for
        (each row may take 64 bytes per entry: a full-vocabulary row of a 150k-token vocabulary
        is ~5 MB); a larger answer fails the member.
    basic_auth: "user:password" for HTTP basic auth (a proxy in front of the server); a Secret
        like api_key.
    """

    base_url: str
    model: str | None = None
    tokenizer: str | None = None
    name: str | None = None
    top_logprobs: int | None = None
    timeout: float = 60.0
    retries: int = 3
    check_tokenizer: bool = True
    api_key: str | Secret | None = field(default=None, repr=False)
    verify: bool | str = True
    cert: str | tuple[str, str] | None = None
    max_answer_bytes: int = 4 * 2**20
    basic_auth: str | Secret | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        if isinstance(self.tokenizer, os.PathLike):
            put("tokenizer", os.fspath(self.tokenizer))
        if not isinstance(self.base_url, str) or not self.base_url.startswith(
            ("http://", "https://")
        ):
            raise InvalidConfigError(
                f"Remote base_url={_without_userinfo(self.base_url)!r} is not an http(s) URL; "
                "pass the server's OpenAI base, e.g. Remote(base_url='http://127.0.0.1:8000/v1', "
                "...)."
            )
        bare, userinfo = split_userinfo(self.base_url)
        if userinfo is not None and self.basic_auth is not None:
            raise InvalidConfigError(
                "Remote got credentials both in base_url (user:password@) and as basic_auth; "
                "pass them one way."
            )
        url = httpx.URL(bare)
        if url.path in ("", "/"):
            bare = str(url.copy_with(path="/v1"))
        put("base_url", bare.rstrip("/"))
        for name, value in (("api_key", self.api_key), ("basic_auth", userinfo or self.basic_auth)):
            put(name, None if value is None or value == "" else Secret(value))
        if self.api_key is not None and self.basic_auth is not None:
            raise InvalidConfigError(
                "Remote takes api_key (a bearer token) or basic auth (user:password), not both: "
                "they would fill the same Authorization header."
            )
        k = self.top_logprobs
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise InvalidConfigError(
                f"Remote top_logprobs={k!r}: use None (full vocabulary when the server allows "
                "it) or a positive number of top tokens, e.g. 20."
            )
        if not isinstance(self.timeout, (int, float)) or not 0 < self.timeout < math.inf:
            raise InvalidConfigError(f"Remote timeout={self.timeout!r} must be seconds > 0.")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise InvalidConfigError(f"Remote retries={self.retries!r} must be an integer >= 0.")
        size = self.max_answer_bytes
        if isinstance(size, bool) or not isinstance(size, int) or size < 1024:
            raise InvalidConfigError(
                f"Remote max_answer_bytes={size!r} must be an integer >= 1024 (bytes)."
            )
        self._check_tls()

    def _check_tls(self) -> None:
        """`verify` and `cert` as plain values, checked by building the TLS context once."""
        verify, cert = self.verify, self.cert
        if isinstance(verify, os.PathLike):
            verify = os.fspath(verify)
        if not isinstance(verify, (bool, str)):
            raise InvalidConfigError(
                f"Remote verify={verify!r}: pass True (the system's CAs), False (no check) or "
                "the path of a CA bundle."
            )
        if isinstance(cert, (str, os.PathLike)):
            cert = os.fspath(cert)
        elif isinstance(cert, (tuple, list)):
            cert = tuple(os.fspath(c) if isinstance(c, os.PathLike) else c for c in cert)
        pair = isinstance(cert, tuple) and len(cert) == 2 and all(isinstance(c, str) for c in cert)
        if cert is not None and not (isinstance(cert, str) or pair):
            raise InvalidConfigError(
                f"Remote cert={cert!r}: pass the path of a PEM file holding the client "
                "certificate and its key, or a (certificate, key) pair of paths."
            )
        object.__setattr__(self, "verify", verify)
        object.__setattr__(self, "cert", cert)
        if verify is not True or cert is not None:
            tls_context(verify, cert)

    @property
    def label(self) -> str:
        """A short display name before connecting (adapters use it in model names)."""
        return self.name or Path(self.model or "").name or self.model or self.base_url

    def fingerprint(self) -> str:
        """Every field, secrets as salted digests: equal for Remotes that reach the same server
        the same way with the same authority (the shared-engine cache keys on it)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return repr({k: v.digest if isinstance(v, Secret) else v for k, v in values.items()})

    def public_fields(self) -> dict[str, Any]:
        """The fields as plain values, without credentials: what a dump or a log may show."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _SECRETS}


_SECRETS = ("api_key", "basic_auth")


class _RemoteDraft(Draft):
    """A Draft whose rows may come later: fetched from the server on first read. SAFE reads
    them, SpecEM and single never do, and full-vocabulary rows for every drafted token cost real
    time; a member whose last draft's rows were read asks for them with the next draft."""

    def __init__(self, ids, stopped, rows, fetch: Callable[[], torch.Tensor], member) -> None:
        self.ids, self.stopped = ids, stopped
        self._rows, self._fetch, self._member = rows, fetch, member

    @property
    def logprobs(self) -> torch.Tensor:  # type: ignore[override]
        self._member.state.rows_read = True
        if self._rows is None:
            self._rows = self._fetch()
        return self._rows


@dataclass
class RemoteRequestState(RequestState):
    """A request's state in a remote member: the member's own plus whether the last draft's
    rows were read (then the next draft asks for its rows in the same request)."""

    rows_read: bool = False


class RemoteMember(Member):
    """One model served over HTTP; see the module docstring for how each operation maps."""

    gives_logits = False
    full_rows = False  # its next-token rows may be top-k; a score comes from prompt log-probs
    state: RemoteRequestState
    state_type = RemoteRequestState

    def __init__(self, spec: Remote, name: str | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.base_url = spec.base_url
        self.root = spec.base_url.removesuffix("/v1")  # vLLM's /tokenize lives at the root
        self.name = name or spec.name or spec.base_url
        self.model = None  # no weights here: the server holds them
        self._secrets = [spec.api_key, spec.basic_auth]  # scrubbed from quoted answers
        key, auth = spec.api_key, spec.basic_auth
        headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}
        user_password = tuple(auth.get_secret_value().split(":", 1)) if auth else None
        self._client = Client(
            headers=headers, auth=user_password, verify=tls_context(spec.verify, spec.cert)
        )
        try:
            self._connect(name)
        except BaseException:
            self._client.close()
            raise

    # --- connecting ------------------------------------------------------------------------

    def _connect(self, name: str | None) -> None:
        served = self._request("GET", f"{self.base_url}/models", read=answers.served_models)
        if self.spec.model is None:
            if len(served) != 1:
                raise InvalidConfigError(
                    f"the server at {self.base_url} serves {sorted(served)}; pass "
                    "Remote(model=...) to pick one."
                )
            self.served = next(iter(served))
        elif self.spec.model in served:
            self.served = self.spec.model
        else:
            raise InvalidConfigError(
                f"the server at {self.base_url} serves {sorted(served)}, not "
                f"{self.spec.model!r}; pass one of those as Remote(model=...) (vLLM's "
                "--served-model-name)."
            )
        entry = served[self.served]
        self.name = name or self.spec.name or Path(self.served).name or self.served
        self.source = self.spec.tokenizer or entry.get("root") or self.served
        try:
            self.tokenizer = load_tokenizer(self.source)
        except ModelLoadError as error:
            raise type(error)(
                f"member {self.name!r}: {error} A remote member tokenizes here: pass "
                "Remote(tokenizer=...) with a local directory or hub id of the server's "
                "tokenizer."
            ) from error
        config, eos = _local_config(self.source)
        bound = max(len(self.tokenizer), config.get("vocab", 0))
        self.top_k, server_vocab = self._probe_logprobs(bound)
        self.full_vocab = self.top_k == -1
        self.vocab = Vocab(self.tokenizer, model_vocab_size=server_vocab or config.get("vocab"))
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        self.stop_ids = frozenset(self.vocab.special_ids) | frozenset(eos)
        windows = [config.get("positions")]
        if entry.get("max_model_len"):  # one position stays free for the generated token
            windows.append(int(entry["max_model_len"]) - 1)
        self.context_window = min((w for w in windows if w), default=2048)
        if self.spec.check_tokenizer:
            self._check_tokenizer()

    def _probe_logprobs(self, bound: int) -> tuple[int, int | None]:
        """The K the server grants (-1: full vocabulary) and, then, its vocabulary size. The
        probe is also the warm-up: a server's first request is slow. `bound`: the vocabulary
        size known here (tokenizer, config), which a top-k row's ids stay below."""
        wanted = -1 if self.spec.top_logprobs is None else self.spec.top_logprobs
        prompt = self.tokenizer("Hello", add_special_tokens=False)["input_ids"][:1] or [0]
        try:  # a full row lists every id once: its ids stay below its length
            rows = self._next_entries([prompt], wanted, bound, own_length=wanted == -1)
        except ServerError as error:
            cap = _MAX_ALLOWED.search(str(error))
            if cap is None or self.spec.top_logprobs is not None:
                if cap is not None:
                    raise InvalidConfigError(
                        f"member {self.name!r}: the server at {self.base_url} allows at most "
                        f"{cap.group(1)} log-probs per position; pass top_logprobs<="
                        f"{cap.group(1)}, or start vLLM with --max-logprobs -1."
                    ) from error
                raise
            wanted = int(cap.group(1))
            rows = self._next_entries([prompt], wanted, bound)
        return wanted, (len(rows[0]) if wanted == -1 else None)

    def _check_tokenizer(self) -> None:
        texts = [TOKENIZER_PROBE]
        greeting = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        # the rendered template checks the special tokens' ids too; no template: `start` says so
        with contextlib.suppress(ChatTemplateError):
            texts.append(render_prompt(self.tokenizer, greeting, self.name))
        for text in texts:
            here = self.vocab.encode_prompt(text)
            body = {"model": self.served, "prompt": text, "add_special_tokens": False}
            there = self._request(
                "POST",
                f"{self.root}/tokenize",
                body,
                check=True,
                read=answers.tokens,
            )
            if here != there:
                i = common_prefix(here, there)
                raise TokenizerMismatchError(
                    f"member {self.name!r}: the server at {self.base_url} tokenizes differently "
                    f"from the tokenizer loaded here from {self.source!r} (first difference at "
                    f"token {i}: {here[i : i + 4]} here, {there[i : i + 4]} there). Start vLLM "
                    "with --tokenizer pointing at the tokenizer files the client uses (vLLM "
                    "loads them with AutoTokenizer, which can re-wrap a tokenizer.json), or pass "
                    "Remote(tokenizer=...) with the tokenizer the server uses."
                )

    # --- HTTP --------------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        url: str,
        body: dict | None = None,
        *,
        check: bool = False,
        read: Callable[[Any], T],
        entries: int = 0,
    ) -> T:
        """One request with retries on connection errors; `read` checks the JSON answer and
        turns it into what the caller needs. `entries`: how many log-prob entries or token ids
        the answer may carry (its size cap grows with them). Every failure names the member."""
        start = time.perf_counter()
        limit = self.spec.max_answer_bytes + _ENTRY_BYTES * entries
        try:
            for attempt in range(self.spec.retries + 1):
                last = attempt == self.spec.retries
                try:
                    status, payload = self._client.request(
                        method, url, json=body, timeout=self.spec.timeout, limit=limit
                    )
                except _RETRYABLE as error:
                    if last:
                        raise ServerError(
                            f"member {self.name!r}: the server at {url} is down or unreachable "
                            f"({type(error).__name__}: {self._quote(str(error))}) after "
                            f"{attempt + 1} attempts; start it (or fix base_url) and send the "
                            "request again.",
                            member=self.name,
                        ) from error
                    time.sleep(min(0.5 * 2**attempt, 4.0))
                    continue
                except TimeoutError as error:
                    raise ServerError(
                        f"member {self.name!r}: no answer from {url} within "
                        f"{self.spec.timeout:g} s; the server is overloaded or stuck (raise "
                        "Remote(timeout=...) for slow servers).",
                        member=self.name,
                    ) from error
                except AnswerTooLarge as error:
                    raise self._invalid(
                        url, f"{error}; raise Remote(max_answer_bytes=...) if it is right"
                    ) from None
                except httpx.HTTPError as error:
                    raise ServerError(
                        f"member {self.name!r}: {url} failed: {self._quote(str(error))}",
                        member=self.name,
                    ) from error
                if status in _RETRY_STATUS and not last:
                    time.sleep(min(0.5 * 2**attempt, 4.0))
                    continue
                if status == 404 and check:
                    raise ServerError(
                        f"member {self.name!r}: {url} does not exist, so the tokenizer cannot "
                        "be checked (vLLM serves /tokenize); pass Remote(check_tokenizer=False) "
                        "if you are sure client and server tokenize alike.",
                        member=self.name,
                    )
                if status != 200:
                    raise ServerError(
                        f"member {self.name!r}: {url} answered {status}: "
                        f"{self._quote(_message(payload))}",
                        member=self.name,
                    )
                try:
                    return read(answers.parse(payload))
                except answers.BadAnswer as error:
                    raise self._invalid(url, str(error)) from None
            raise AssertionError("unreachable")
        finally:
            self.state.calls += 1
            self.state.seconds += time.perf_counter() - start

    def _invalid(self, url: str, what: str) -> ServerError:
        return ServerError(
            f"member {self.name!r}: {url} gave an answer this client cannot use: "
            f"{self._quote(what)}. Is the server vLLM (>= 0.10.2), serving the model this "
            "member expects?",
            member=self.name,
        )

    def _quote(self, text: str) -> str:
        """What a server said, cut short and without this member's credentials."""
        return scrub(text, self._secrets)

    def _complete(
        self, body: dict, count: int, read: Callable[[list[dict]], T], entries: int = 0
    ) -> T:
        """POST /v1/completions with `count` prompts; `read` gets the choices in prompt order.
        Every sampling setting is sent: vLLM otherwise fills unset ones from the model's
        generation_config.json."""
        full = {
            "model": self.served,
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "ignore_eos": True,  # the member's own stop ids decide (`stop_token_ids`)
            **body,
        }
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        entries += sum(map(len, prompts))  # vLLM may echo each prompt's ids
        return self._request(
            "POST",
            f"{self.base_url}/completions",
            full,
            read=lambda data: read(answers.choices(data, count)),
            entries=entries,
        )

    def _next_entries(
        self, prompts: list[list[int]], k: int, size: int, own_length: bool = False
    ) -> list[dict[int, float]]:
        """The next-token row after each prompt, as {id: log-prob}, its ids below `size` (or,
        `own_length`, below the row's length: a full row before the vocabulary is known)."""
        body = {
            "prompt": prompts,
            "max_tokens": 1,
            "logprobs": k,
            "return_tokens_as_token_ids": True,
        }
        bound = None if own_length else size
        return self._complete(
            body,
            len(prompts),
            lambda choices: [answers.next_row(c, bound) for c in choices],
            entries=len(prompts) * (size if k == -1 else k + 1),
        )

    @property
    def _row_entries(self) -> int:
        """How many entries one next-token row of this server has at most."""
        return self.vocab.size if self.full_vocab else self.top_k + 1

    def _next_rows(self, prompts: list[list[int]]) -> torch.Tensor:
        """Next-token log-probs after each prompt: [prompts, vocab], one request."""
        if not prompts:
            return torch.empty(0, self.vocab.size)
        entries = self._next_entries(prompts, self.top_k, self.vocab.size)
        return torch.stack([self._row(e) for e in entries])

    def _row(self, entries: dict[int, float]) -> torch.Tensor:
        size = self.vocab.size
        row = torch.full((size,), -math.inf)
        if entries and not self.full_vocab:  # top-k: the rest share what is left, evenly
            left = 1.0 - sum(math.exp(v) for v in entries.values())
            if left > 0 and size > len(entries):
                row.fill_(min(math.log(left / (size - len(entries))), min(entries.values())))
        if entries:
            row[list(entries)] = torch.tensor(list(entries.values()), dtype=torch.float32)
        return row

    @property
    def _stops(self) -> list[int]:
        """The stop ids as the server takes them (read each time: a benchmark may clear them)."""
        return sorted(i for i in self.stop_ids if i < self.vocab.size)

    def close(self) -> None:
        self._client.close()

    # --- the Member interface ------------------------------------------------------------------

    @property
    def runs_on(self) -> str:
        return f"remote:{id(self)}"  # a server: overlaps with everything else

    @property
    def _rows(self) -> dict[int, torch.Tensor]:
        """Prefix length -> next-token log-probs: the last rows asked for (never mutated: a new
        dict replaces it, so a failed operation's state can be put back)."""
        return self.state.sequence.cache or {}

    def _rewind(self, keep: int) -> None:
        self.state.sequence.cache = {n: row for n, row in self._rows.items() if n <= keep}

    def _model_logprobs(self, boundaries: Sequence[int]) -> torch.Tensor:
        self._check_boundaries(boundaries)
        with self._transaction("next-token distributions"):
            ends = [self.state.sequence.prompt_len + b for b in boundaries]
            missing = sorted({n for n in ends if n not in self._rows})
            if missing:
                self._check_cancelled()
                rows = self._next_rows([self.state.sequence.seq[:n] for n in missing])
                kept = {n: self._rows[n] for n in ends if n in self._rows}
                self.state.sequence.cache = {**kept, **dict(zip(missing, rows, strict=True))}
            return torch.stack([self._rows[n] for n in ends])

    def draft(self, max_tokens: int, sampler: Sampler, guess: str = "") -> Draft:
        """The server drafts all `max_tokens` in one call, so a `guess` saves nothing here."""
        with self._transaction("draft"):
            return self._draft(max_tokens, sampler)

    def _draft(self, max_tokens: int, sampler: Sampler) -> Draft:
        n = min(max_tokens, self.window_left)
        if n <= 0:
            return Draft([], torch.empty(0, self.vocab.size), False)
        self._check_cancelled()
        prefix = list(self.state.sequence.seq)
        if sampler.greedy:
            sampling: dict[str, Any] = {"temperature": 0.0}
        else:  # the server samples, seeded from the request's generator: reproducible
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=sampler.generator))
            sampling = {"temperature": sampler.temperature, "top_p": sampler.top_p, "seed": seed}
        body = {"prompt": prefix, "max_tokens": n, "stop_token_ids": self._stops}
        with_rows, size = self.state.rows_read, self.vocab.size
        if with_rows:
            body.update(logprobs=self.top_k, return_tokens_as_token_ids=True)

        def read(choices: list[dict]) -> tuple[list[int] | None, list | None]:
            ids = answers.generated_ids(choices[0], n, size)
            if not (ids and with_rows):
                return ids, None
            entries = answers.top_rows(choices[0], n, size)
            if len(entries) != len(ids):
                raise answers.BadAnswer(f"{len(entries)} log-prob rows for {len(ids)} tokens")
            return ids, entries

        per_token = (self._row_entries if with_rows else 0) + 1
        body.update(sampling, return_token_ids=True)
        ids, entries = self._complete(body, 1, read, entries=n * per_token)
        if ids is None:
            raise ServerError(
                f"member {self.name!r}: the server at {self.base_url} does not return token "
                "ids (vLLM's return_token_ids, vLLM >= 0.10.2); upgrade the server.",
                member=self.name,
            )
        if self.state.sequence.grammar is not None:  # the server drafted unconstrained
            ids = ids[: self._valid_part(ids)]
            if not ids:  # not even its first token: one constrained step from its log-probs
                self.state.rows_read = False
                return Member.draft(self, 1, sampler)
            entries = entries[: len(ids)] if entries else None
        stopped = bool(ids) and ids[-1] in self.stop_ids
        if stopped:
            ids.pop()
        for token in ids:
            self._append(token)
        count = len(ids) + int(stopped)
        rows = None if count else torch.empty(0, self.vocab.size)
        if entries and count:
            rows = self._masked(torch.stack([self._row(e) for e in entries]), len(prefix))
        self.state.rows_read = False

        def fetch() -> torch.Tensor:
            return self._masked(
                self._next_rows([prefix + ids[:j] for j in range(count)]), len(prefix)
            )

        return _RemoteDraft(ids, stopped, rows, fetch, self)

    def _valid_part(self, ids: list[int]) -> int:
        """How many of the drafted ids (a final stop included) the request's grammar accepts
        after the current text: the draft is cut at the first invalid token."""
        grammar = self.state.sequence.grammar
        grammar.follow(self.ids)
        return grammar.valid_prefix(ids)

    def _masked(self, rows: torch.Tensor, start: int) -> torch.Tensor:
        """Drafted rows as the constrained distributions they stand for (row j: after the
        first `start - prompt + j` response ids)."""
        base = start - self.state.sequence.prompt_len
        return self._constrained(rows, [base + j for j in range(rows.shape[0])])

    def _continuation_scores(
        self, blocks: list[list[int]], ends: list[bool], start: int, raw: bool
    ) -> list[torch.Tensor]:
        """Token log-probs of each continuation (the same tokenization as in-process members),
        from ONE request: a prompt per continuation, `prompt_logprobs=0`."""
        if raw:
            raise InvalidConfigError(
                f"member {self.name!r} is served over HTTP, which gives log-probs, not raw "
                "logits; use SpecEM's score='logprob' or 'prob' with remote members."
            )
        with self._transaction("verify-in-line scoring"):
            return self._score(blocks, ends, start)

    def _score(self, blocks: list[list[int]], ends: list[bool], start: int) -> list[torch.Tensor]:
        if not blocks:
            return []
        self._check_cancelled()
        body: dict[str, Any] = {
            "prompt": [self.state.sequence.seq[:start] + block for block in blocks],
            "max_tokens": 1,
            "prompt_logprobs": 0,
        }
        if any(ends):  # the row after each continuation, for the stop ids only
            body.update(logprobs=1, logprob_token_ids=self._stops, return_tokens_as_token_ids=True)
        size = self.vocab.size

        def read(choices: list[dict]) -> list[tuple[list[float], dict[int, float] | None]]:
            return [
                (
                    [answers.prompt_logprob(c, start + j, t) for j, t in enumerate(block)],
                    answers.next_row(c, size) if end else None,  # its stop ids included
                )
                for block, end, c in zip(blocks, ends, choices, strict=True)
            ]

        # a prompt position's entry carries its decoded token: room for 8 entries each
        positions = sum(len(prompt) for prompt in body["prompt"])
        room = 7 * positions + len(blocks) * (len(self._stops) + 2)
        scores = []
        for values, end_row in self._complete(body, len(blocks), read, entries=room):
            if end_row is not None:
                values.append(max(float(stop_logprob(self._row(end_row), self.stop_ids)), -1e30))
            scores.append(torch.tensor(values, dtype=torch.float32))
        return scores

    def _model_branch_logprobs(
        self, boundary: int, branches: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        with self._transaction("branch scoring"):
            branches = self._check_branches(boundary, branches)
            self._check_cancelled()
            sequence = self.state.sequence
            prefix = sequence.seq[: sequence.prompt_len + boundary]
            return self._next_rows([prefix + branch for branch in branches])


def _local_config(source: str) -> tuple[dict[str, int], list[int]]:
    """Window, vocabulary size and end-of-turn ids from the tokenizer's source, when it has a
    model config (a hub id or a model directory does; a bare tokenizer directory need not)."""
    from transformers import AutoConfig, GenerationConfig

    found: dict[str, int] = {}
    eos: list[int] = []
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False).get_text_config()
        positions = (
            getattr(config, "max_position_embeddings", None)
            or getattr(config, "n_positions", None)
            or getattr(config, "n_ctx", None)
        )
        if positions:
            found["positions"] = int(positions)
        if getattr(config, "vocab_size", None):
            found["vocab"] = int(config.vocab_size)
    except (OSError, ValueError):
        pass
    try:
        ids = GenerationConfig.from_pretrained(source).eos_token_id
        eos = [ids] if isinstance(ids, int) else list(ids or [])
    except (OSError, ValueError):
        pass
    return found, eos


def _message(payload: bytes) -> str:
    """The error message in a server's error answer (its body when it has none)."""
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        return payload.decode(errors="replace")
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)
    return str(error)


def _without_userinfo(url: object) -> object:
    """A URL as an error may show it: anything before an "@" (credentials) left out."""
    return f"…@{url.rsplit('@', 1)[1]}" if isinstance(url, str) and "@" in url else url


def wait_until_healthy(base_url: str, timeout: float = 240.0) -> bool:
    """Whether the server at `base_url` answers vLLM's `/health` within `timeout` seconds (for
    scripts that start servers: a CPU vLLM server needs ~40 s)."""
    root = Remote(base_url).base_url.removesuffix("/v1")
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{root}/health", timeout=2).status_code == 200:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(1)


def connect(spec: Remote, name: str | None = None) -> RemoteMember:
    """A `RemoteMember` for `spec` (what `Ensemble.from_pretrained` does with a `Remote`)."""
    if not isinstance(spec, Remote):
        raise InvalidConfigError(f"expected a Remote(...), got {spec!r}.")
    return RemoteMember(spec, name)


__all__ = ["Remote", "RemoteMember", "connect", "wait_until_healthy"]
