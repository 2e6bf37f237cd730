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
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

from .chat import render_prompt
from .errors import (
    ChatTemplateError,
    InvalidConfigError,
    ModelLoadError,
    ServerError,
    TokenizerMismatchError,
)
from .kv import common_prefix
from .loading import TOKENIZER_PROBE, load_tokenizer
from .member import Draft, Member
from .sampling import Sampler
from .vocab import Vocab, stop_logprob

_RETRYABLE = (  # the server is (re)starting or went away: trying again may help
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)
_RETRY_STATUS = (502, 503, 504)
_MAX_ALLOWED = re.compile(r"max(?:imum)? allowed:?\s*(\d+)")


@dataclass(frozen=True)
class Remote:
    """A member served by vLLM (or another OpenAI-compatible server with vLLM's extensions).

    base_url: the server's OpenAI base, e.g. "http://10.0.0.5:8000/v1" ("/v1" is added when
        the URL has no path).
    model: the served model name (`--served-model-name`); None: the server's only model.
    tokenizer: a local directory or hub id of the SAME tokenizer the server uses; None: the path
        the server loaded the model from (works when client and server see the same files).
    name: the member's name in events and stats (default: the last part of the model name).
    top_logprobs: None asks for full-vocabulary distributions when the server allows it
        (`--max-logprobs -1`) and for its cap otherwise; an int asks for that top-k.
    timeout: seconds to wait for one answer; retries: attempts after a connection error
        (0.5 s, 1 s, 2 s, ... apart) before the member is reported down.
    check_tokenizer: compare the local tokenizer with the server's `/tokenize` at start.
    api_key: sent as a bearer token (vLLM's `--api-key`).
    """

    base_url: str
    model: str | None = None
    tokenizer: str | None = None
    name: str | None = None
    top_logprobs: int | None = None
    timeout: float = 60.0
    retries: int = 3
    check_tokenizer: bool = True
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.tokenizer, os.PathLike):
            object.__setattr__(self, "tokenizer", os.fspath(self.tokenizer))
        if not isinstance(self.base_url, str) or not self.base_url.startswith(
            ("http://", "https://")
        ):
            raise InvalidConfigError(
                f"Remote base_url={self.base_url!r} is not an http(s) URL; pass the server's "
                "OpenAI base, e.g. Remote(base_url='http://127.0.0.1:8000/v1', ...)."
            )
        url = httpx.URL(self.base_url)
        if url.path in ("", "/"):
            object.__setattr__(self, "base_url", str(url.copy_with(path="/v1")))
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
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

    @property
    def label(self) -> str:
        """A short display name before connecting (adapters use it in model names)."""
        return self.name or Path(self.model or "").name or self.model or self.base_url


def source_label(source: str | os.PathLike | Remote) -> str:
    """A member source as adapters show it: a directory's name, a hub id, a Remote's name."""
    if isinstance(source, Remote):
        return source.label
    text = os.fspath(source)
    return Path(text).name or text


def _token_id(key: str) -> int:
    if not key.startswith("token_id:"):
        raise ServerError(
            f"the server answered log-probs keyed by text ({key!r}), not by token id; remote "
            "members need vLLM's return_tokens_as_token_ids (vLLM >= 0.6)."
        )
    return int(key[9:])


class _RemoteDraft(Draft):
    """A Draft whose rows may come later: fetched from the server on first read. SAFE reads
    them, SpecEM and single never do, and full-vocabulary rows for every drafted token cost real
    time; a member whose last draft's rows were read asks for them with the next draft."""

    def __init__(self, ids, stopped, rows, fetch: Callable[[], torch.Tensor], member) -> None:
        self.ids, self.stopped = ids, stopped
        self._rows, self._fetch, self._member = rows, fetch, member

    @property
    def logprobs(self) -> torch.Tensor:  # type: ignore[override]
        self._member._rows_read = True
        if self._rows is None:
            self._rows = self._fetch()
        return self._rows


class RemoteMember(Member):
    """One model served over HTTP; see the module docstring for how each operation maps."""

    gives_logits = False

    def __init__(self, spec: Remote, name: str | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.base_url = spec.base_url
        self.root = spec.base_url.removesuffix("/v1")  # vLLM's /tokenize lives at the root
        self.name = name or spec.name or spec.base_url
        self.model = None  # no weights here: the server holds them
        self._rows_read = False  # the last draft's rows were read: send them with the next
        headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
        self._client = httpx.Client(
            timeout=httpx.Timeout(spec.timeout, connect=min(spec.timeout, 10.0)), headers=headers
        )
        try:
            self._connect(name)
        except BaseException:
            self._client.close()
            raise

    # --- connecting ------------------------------------------------------------------------

    def _connect(self, name: str | None) -> None:
        listing = self._request("GET", f"{self.base_url}/models")
        served = {entry["id"]: entry for entry in listing.get("data", [])}
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
        self.top_k, server_vocab = self._probe_logprobs()
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

    def _probe_logprobs(self) -> tuple[int, int | None]:
        """The K the server grants (-1: full vocabulary) and, then, its vocabulary size. The
        probe is also the warm-up: a server's first request is slow."""
        wanted = -1 if self.spec.top_logprobs is None else self.spec.top_logprobs
        prompt = self.tokenizer("Hello", add_special_tokens=False)["input_ids"][:1] or [0]
        try:
            rows = self._next_entries([prompt], wanted)
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
            rows = self._next_entries([prompt], wanted)
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
            there = self._request("POST", f"{self.root}/tokenize", body, check=True)["tokens"]
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
        self, method: str, url: str, body: dict | None = None, check: bool = False
    ) -> dict:
        """One request with retries on connection errors; every failure names the member."""
        start = time.perf_counter()
        try:
            for attempt in range(self.spec.retries + 1):
                last = attempt == self.spec.retries
                try:
                    response = self._client.request(method, url, json=body)
                except _RETRYABLE as error:
                    if last:
                        raise ServerError(
                            f"member {self.name!r}: the server at {url} is down or unreachable "
                            f"({type(error).__name__}: {error}) after {attempt + 1} attempts; "
                            "start it (or fix base_url) and send the request again.",
                            member=self.name,
                        ) from error
                    time.sleep(min(0.5 * 2**attempt, 4.0))
                    continue
                except httpx.TimeoutException as error:
                    raise ServerError(
                        f"member {self.name!r}: no answer from {url} within "
                        f"{self.spec.timeout:g} s; the server is overloaded or stuck (raise "
                        "Remote(timeout=...) for slow servers).",
                        member=self.name,
                    ) from error
                except httpx.HTTPError as error:
                    raise ServerError(
                        f"member {self.name!r}: {url} failed: {error}", member=self.name
                    ) from error
                if response.status_code in _RETRY_STATUS and not last:
                    time.sleep(min(0.5 * 2**attempt, 4.0))
                    continue
                if response.status_code == 404 and check:
                    raise ServerError(
                        f"member {self.name!r}: {url} does not exist, so the tokenizer cannot "
                        "be checked (vLLM serves /tokenize); pass Remote(check_tokenizer=False) "
                        "if you are sure client and server tokenize alike.",
                        member=self.name,
                    )
                if response.status_code != 200:
                    raise ServerError(
                        f"member {self.name!r}: {url} answered {response.status_code}: "
                        f"{_message(response)}",
                        member=self.name,
                    )
                return response.json()
            raise AssertionError("unreachable")
        finally:
            self.calls += 1
            self.seconds += time.perf_counter() - start

    def _complete(self, body: dict) -> list[dict]:
        """POST /v1/completions; the choices in prompt order. Every sampling setting is sent:
        vLLM otherwise fills unset ones from the model's generation_config.json."""
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
        choices = self._request("POST", f"{self.base_url}/completions", full)["choices"]
        return sorted(choices, key=lambda c: c["index"])

    def _next_entries(self, prompts: list[list[int]], k: int) -> list[dict[str, float]]:
        body = {"prompt": prompts, "max_tokens": 1, "logprobs": k}
        choices = self._complete({**body, "return_tokens_as_token_ids": True})
        return [c["logprobs"]["top_logprobs"][0] for c in choices]

    def _next_rows(self, prompts: list[list[int]]) -> torch.Tensor:
        """Next-token log-probs after each prompt: [prompts, vocab], one request."""
        if not prompts:
            return torch.empty(0, self.vocab.size)
        return torch.stack([self._row(e) for e in self._next_entries(prompts, self.top_k)])

    def _row(self, entries: dict[str, float]) -> torch.Tensor:
        size = self.vocab.size
        pairs = [(i, v) for i, v in ((_token_id(k), v) for k, v in entries.items()) if i < size]
        row = torch.full((size,), -math.inf)
        if pairs and not self.full_vocab:  # top-k: the rest share what is left, evenly
            values = [v for _, v in pairs]
            left = 1.0 - sum(math.exp(v) for v in values)
            if left > 0 and size > len(pairs):
                row.fill_(min(math.log(left / (size - len(pairs))), min(values)))
        if pairs:
            ids, values = zip(*pairs, strict=True)
            row[list(ids)] = torch.tensor(values, dtype=torch.float32)
        return row

    @property
    def _stops(self) -> list[int]:
        """The stop ids as the server takes them (read each time: a benchmark may clear them)."""
        return sorted(i for i in self.stop_ids if i < self.vocab.size)

    def close(self) -> None:
        self._client.close()

    # --- the Member interface ------------------------------------------------------------------

    @property
    def lane(self) -> str:
        return f"remote:{id(self)}"  # a server: overlaps with everything else

    def spawn(self, cancel=None, reuse: bool = True) -> RemoteMember:
        twin = super().spawn(cancel, reuse)
        twin._rows_read = False
        return twin

    @property
    def _rows(self) -> dict[int, torch.Tensor]:
        """Prefix length -> next-token log-probs: the last rows asked for (never mutated: a new
        dict replaces it, so a failed operation's state can be put back)."""
        return self._state.cache or {}

    def _rewind(self, keep: int) -> None:
        self._state.cache = {n: row for n, row in self._rows.items() if n <= keep}

    def logprobs(self, boundaries: Sequence[int]) -> torch.Tensor:
        self._check_boundaries(boundaries)
        with self._transaction("next-token distributions"):
            ends = [self._state.prompt_len + b for b in boundaries]
            missing = sorted({n for n in ends if n not in self._rows})
            if missing:
                self._check_cancelled()
                rows = self._next_rows([self._state.seq[:n] for n in missing])
                kept = {n: self._rows[n] for n in ends if n in self._rows}
                self._state.cache = {**kept, **dict(zip(missing, rows, strict=True))}
            return torch.stack([self._rows[n] for n in ends])

    def draft(self, max_tokens: int, sampler: Sampler) -> Draft:
        with self._transaction("draft"):
            return self._draft(max_tokens, sampler)

    def _draft(self, max_tokens: int, sampler: Sampler) -> Draft:
        n = min(max_tokens, self.room)
        if n <= 0:
            return Draft([], torch.empty(0, self.vocab.size), False)
        self._check_cancelled()
        prefix = list(self._state.seq)
        if sampler.greedy:
            sampling: dict[str, Any] = {"temperature": 0.0}
        else:  # the server samples, seeded from the request's generator: reproducible
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=sampler.generator))
            sampling = {"temperature": sampler.temperature, "top_p": sampler.top_p, "seed": seed}
        body = {"prompt": prefix, "max_tokens": n, "stop_token_ids": self._stops}
        if self._rows_read:
            body.update(logprobs=self.top_k, return_tokens_as_token_ids=True)
        choice = self._complete({**body, **sampling, "return_token_ids": True})[0]
        ids = choice.get("token_ids")
        if ids is None:
            raise ServerError(
                f"member {self.name!r}: the server at {self.base_url} does not return token "
                "ids (vLLM's return_token_ids, vLLM >= 0.10.2); upgrade the server.",
                member=self.name,
            )
        ids = list(ids)
        entries = choice["logprobs"]["top_logprobs"] if self._rows_read and ids else None
        if self._state.grammar is not None:  # the server drafts unconstrained: keep what fits
            ids = ids[: self._valid_part(ids)]
            if not ids:  # not even its first token: one constrained step from its log-probs
                self._rows_read = False
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
        self._rows_read = False

        def fetch() -> torch.Tensor:
            return self._masked(
                self._next_rows([prefix + ids[:j] for j in range(count)]), len(prefix)
            )

        return _RemoteDraft(ids, stopped, rows, fetch, self)

    def _valid_part(self, ids: list[int]) -> int:
        """How many of the drafted ids (a final stop included) the request's grammar accepts
        after the current text: the draft is cut at the first invalid token."""
        grammar = self._state.grammar
        grammar.follow(self.ids)
        return grammar.valid_prefix(ids)

    def _masked(self, rows: torch.Tensor, start: int) -> torch.Tensor:
        """Drafted rows as the constrained distributions they stand for (row j: after the
        first `start - prompt + j` response ids)."""
        base = start - self._state.prompt_len
        return self.constrained_rows(rows, [base + j for j in range(rows.shape[0])])

    def score(
        self,
        continuations: Sequence[str],
        *,
        base: str | None = None,
        ends: Sequence[bool] | None = None,
        raw: bool = False,
    ) -> list[torch.Tensor]:
        """Token log-probs of each continuation (the same tokenization as in-process members),
        from ONE request: a prompt per continuation, `prompt_logprobs=0`."""
        if raw:
            raise InvalidConfigError(
                f"member {self.name!r} is served over HTTP, which gives log-probs, not raw "
                "logits; use SpecEM's score='logprob' or 'prob' with remote members."
            )
        with self._transaction("verify-in-line scoring"):
            return self._score(continuations, base, ends)

    def _score(self, continuations, base, ends) -> list[torch.Tensor]:
        blocks, ends, start = self._continuation_blocks(continuations, base, ends)
        if not blocks:
            return []
        self._check_cancelled()
        body: dict[str, Any] = {
            "prompt": [self._state.seq[:start] + block for block in blocks],
            "max_tokens": 1,
            "prompt_logprobs": 0,
        }
        if any(ends):  # the row after each continuation, for the stop ids only
            body.update(logprobs=1, logprob_token_ids=self._stops, return_tokens_as_token_ids=True)
        scores = []
        for block, end, choice in zip(blocks, ends, self._complete(body), strict=True):
            rows = choice["prompt_logprobs"]
            values = [rows[start + j][str(token)]["logprob"] for j, token in enumerate(block)]
            if end:
                row = self._row(choice["logprobs"]["top_logprobs"][0])  # its stop ids included
                values.append(max(float(stop_logprob(row, self.stop_ids)), -1e30))
            scores.append(torch.tensor(values, dtype=torch.float32))
        return scores

    def branch_logprobs(self, boundary: int, branches: Sequence[Sequence[int]]) -> torch.Tensor:
        with self._transaction("branch scoring"):
            branches = self._check_branches(boundary, branches)
            self._check_cancelled()
            prefix = self._state.seq[: self._state.prompt_len + boundary]
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


def _message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message") or error.get("detail") or error)[:500]
    return str(error)[:500]


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


__all__ = ["Remote", "RemoteMember", "connect", "source_label", "wait_until_healthy"]
