"""What a server runs: the ensemble to load, where to listen, who may call, and the limits.

Built from the command line, an `ensemble.toml`, or both (a flag given on the command line wins
over the file). Plain dataclasses, free of the server libraries, so the CLI can check a
configuration before anything heavy is imported.

```toml
method = "safe"
members = ["Qwen/Qwen2.5-1.5B-Instruct",
           {path = "gemma-3-270m.gguf", chat_template = "gemma.jinja", stop = ["<end_of_turn>"]},
           {base_url = "http://10.0.0.5:8000/v1", model = "llama", tokenizer = "meta-llama/..."}]
on_member_failure = "drop"      # any ensemble option (core.options), by its name
max_concurrency = 16
weights = "trust.json"          # what Ensemble.save_weights wrote (after calibrate), frozen

[options]          # the method's options
top_k = 10

[server]
host = "0.0.0.0"
port = 8000
names = ["ensemble"]
api_key_file = "/run/secrets/ensemble-keys"

[limits]
max_tokens = 1024
```
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InvalidConfigError
from core.methods import DEFAULT_METHOD
from core.options import NAMES as OPTION_NAMES
from core.options import Options, check_options

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

API_KEY_ENV = "LLM_ENSEMBLING_API_KEY"  # one key, or several separated by commas


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; each is refused with its own status and message."""

    max_body_bytes: int = 4 << 20
    max_messages: int = 512
    max_tools: int = 64
    max_schema_bytes: int = 32 << 10  # one tool's parameters, or the response_format schema
    max_tokens: int = 2048  # max_tokens a request may ask for (and the chat default)
    max_stop: int = 8


# The server's own defaults for ensemble options: a request waits at most a minute for a slot,
# then is answered 429.
SERVE_DEFAULTS = {"queue_timeout": 60.0}


@dataclass(frozen=True)
class EnsembleSpec:
    """`Ensemble.from_pretrained`'s arguments: the members, the method and its `options`, and
    the ensemble options (`core.options`), checked; each reads as an attribute too
    (`spec.max_concurrency`)."""

    members: tuple[Any, ...] = ()  # paths, .gguf files, hub ids, dicts of Local's/Remote's fields
    method: str = DEFAULT_METHOD
    options: dict[str, Any] = field(default_factory=dict)  # the method's options
    settings: Options = field(default_factory=lambda: check_options({}, defaults=SERVE_DEFAULTS))
    weights: str | None = None  # a file Ensemble.save_weights wrote, loaded frozen

    @classmethod
    def of(cls, given: dict[str, Any]) -> EnsembleSpec:
        """From an ensemble.toml's top level (flags merged over it): members, method, options,
        and ensemble options by name."""
        given = dict(given)
        members = tuple(given.pop("members", ()))
        method = given.pop("method", DEFAULT_METHOD)
        options = dict(given.pop("options", None) or {})
        weights = given.pop("weights", None)
        if weights is not None and not isinstance(weights, str):
            raise InvalidConfigError(
                f"weights must be the path of a file save_weights wrote, got {weights!r}."
            )
        settings = check_options(given, defaults=SERVE_DEFAULTS)
        return cls(members, method, options, settings, weights)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "settings":
            raise AttributeError(name)
        return getattr(self.settings, name)

    def load(self):
        from core import Ensemble

        if not self.members:
            raise InvalidConfigError(
                "serve needs members: --model PATH (repeat per member: a directory, a .gguf "
                "file, ollama:NAME, a hub id, or a JSON object of Local's or Remote's fields) or "
                "members = [...] in the --config file."
            )
        ensemble = Ensemble.from_pretrained(
            list(self.members), self.method, **self.settings, **self.options
        )
        if self.weights is not None:  # calibrated or learned elsewhere; frozen, so every
            ensemble.load_weights(self.weights)  # answer depends on its request alone
        return ensemble


@dataclass(frozen=True)
class ServeSettings:
    ensemble: EnsembleSpec = field(default_factory=EnsembleSpec)
    host: str = "127.0.0.1"
    port: int = 8000
    names: tuple[str, ...] = ("ensemble",)  # the `model` values requests may use
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    limits: Limits = field(default_factory=Limits)
    grace_seconds: float = 30.0  # in-flight requests may finish this long after SIGTERM
    log_level: str = "info"
    threads: int | None = None  # torch CPU threads (None: torch's default)
    header_timeout: float = 10.0  # seconds a connection may take to send a request's headers
    body_timeout: float = 30.0  # seconds a request may take to send its body
    # deltas per streamed chunk (the first and the last at once): fewer, larger chunks cost the
    # server less per token where tokens come faster than a reader needs them
    stream_interval: int = 1

    def __post_init__(self) -> None:
        if not self.names or any(not isinstance(n, str) or not n for n in self.names):
            raise InvalidConfigError("names must be one or more non-empty model names.")
        if any(not isinstance(k, str) or not k.strip() for k in self.api_keys):
            raise InvalidConfigError("an API key is empty; give non-empty keys.")
        for name, value in dataclasses.asdict(self.limits).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfigError(f"limit {name}={value!r} must be a positive integer.")
        if not 0 <= self.port <= 65535:
            raise InvalidConfigError(f"port {self.port} is not a TCP port (0..65535).")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise InvalidConfigError(f"threads={self.threads!r} must be a positive integer.")
        interval = self.stream_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise InvalidConfigError(
                f"stream_interval={interval!r} must be a positive integer (deltas per streamed "
                "chunk; 1 sends each delta as it comes)."
            )
        if not self.grace_seconds >= 0:
            raise InvalidConfigError(f"grace_seconds={self.grace_seconds!r} must be >= 0.")
        for name in ("header_timeout", "body_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidConfigError(f"{name}={value!r} must be seconds > 0.")

    def check_bind(self) -> None:
        """A server reachable from other machines must ask for a key."""
        if not self.api_keys and not is_loopback(self.host):
            raise InvalidConfigError(
                f"refusing to listen on {self.host!r} without an API key: anyone who reaches "
                f"that address could use the models. Give --api-key (or set {API_KEY_ENV}, or "
                "--api-key-file), or listen on 127.0.0.1."
            )


@functools.lru_cache(maxsize=256)  # read on every request of a keyless server
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another host name: it may resolve anywhere


def read_keys(
    given: list[str] | tuple[str, ...] = (), key_file: str | None = None, environ=None
) -> tuple[str, ...]:
    """Keys from the command line, a file (one per line, `#` comments) and the environment."""
    environ = os.environ if environ is None else environ
    keys = [k.strip() for k in given]
    if key_file:
        try:
            lines = Path(key_file).read_text(encoding="utf-8").splitlines()
        except OSError as error:
            raise InvalidConfigError(
                f"cannot read the API key file {key_file!r}: {error.strerror}."
            ) from None
        found = [k for k in (line.strip() for line in lines) if k and not k.startswith("#")]
        if not found:
            raise InvalidConfigError(
                f"the API key file {key_file!r} holds no key (it is empty or all comments); "
                "put one key per line in it, or drop --api-key-file: a server told to read its "
                "keys from a file does not start without any."
            )
        keys += found
    keys += [k.strip() for k in environ.get(API_KEY_ENV, "").split(",") if k.strip()]
    if any(not k for k in keys):
        raise InvalidConfigError("an API key is empty; give non-empty keys.")
    return tuple(dict.fromkeys(keys))


_TOP = {"members", "method", "options", "weights", *OPTION_NAMES}
# the [server] table: ServeSettings' own fields, and where to read the keys from
_SERVER = {f.name for f in dataclasses.fields(ServeSettings)} - {"ensemble", "limits"}
_SERVER |= {"api_key_file"}
_LIMITS = {f.name for f in dataclasses.fields(Limits)}


def read_config(path: str) -> dict[str, Any]:
    """An ensemble.toml as {"ensemble": {...}, "server": {...}, "limits": {...}}, every key
    checked, so a typo fails here by name instead of being ignored."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as error:
        raise InvalidConfigError(f"cannot read --config {path!r}: {error.strerror}.") from None
    except tomllib.TOMLDecodeError as error:
        raise InvalidConfigError(f"--config {path!r} is not valid TOML: {error}.") from None
    server = data.pop("server", {})
    limits = data.pop("limits", {})
    for section, keys, known in (
        ("top level", data, _TOP),
        ("[server]", server, _SERVER),
        ("[limits]", limits, _LIMITS),
    ):
        if not isinstance(keys, dict):
            raise InvalidConfigError(f"--config {path!r}: {section} must be a table.")
        unknown = sorted(set(keys) - known)
        if unknown:
            raise InvalidConfigError(
                f"--config {path!r}: unknown key(s) {', '.join(unknown)} in the {section}; "
                f"known: {', '.join(sorted(known))}."
            )
    return {"ensemble": data, "server": server, "limits": limits}


def build_settings(
    config: dict[str, Any] | None = None,
    *,
    ensemble: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
    api_keys: list[str] | tuple[str, ...] = (),
    environ=None,
) -> ServeSettings:
    """Settings from a read config file, overridden by the given (command-line) values; None
    values count as not given."""
    config = config or {"ensemble": {}, "server": {}, "limits": {}}

    def merged(base: dict, override: dict | None) -> dict:
        return {**base, **{k: v for k, v in (override or {}).items() if v is not None}}

    spec = merged(config["ensemble"], ensemble)
    where = merged(config["server"], server)
    keys = read_keys(
        [*where.pop("api_keys", ()), *api_keys], where.pop("api_key_file", None), environ
    )
    if "names" in where:
        where["names"] = tuple(where["names"])
    try:
        return ServeSettings(
            ensemble=EnsembleSpec.of(spec),
            limits=Limits(**merged(config["limits"], limits)),
            api_keys=keys,
            **where,
        )
    except TypeError as error:
        raise InvalidConfigError(f"serve settings: {error}.") from None
