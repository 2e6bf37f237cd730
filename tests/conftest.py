"""Shared fixtures: tiny random-weight members on the three testbed tokenizers (structure tests,
about a second to build) and the shipped trained models (behaviour tests)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import sys
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# Tiny models gain nothing from intra-op threads, and lose a lot when the cores are busy.
torch.set_num_threads(1)

# Property tests draw new examples on every run (they find bugs that way); a gate that must give
# the same verdict on the same tree (HYPOTHESIS_PROFILE=ci, as .ci/run sets) draws a fixed set.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from core import Ensemble, HFMember  # noqa: E402
from core.testbed import MODEL_ORDER, model_paths, random_model  # noqa: E402
from core.user_cache import CACHE_ENV  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def run_cache(tmp_path_factory):
    """What the library keeps across processes (the real testbed's joined GGUF file, built-in
    self-preference measurements) goes to a folder of this run's, never the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        name: str(random_model(name, root / name, seed=i)) for i, name in enumerate(MODEL_ORDER)
    }


@pytest.fixture(scope="session")
def tiny_members(tiny_dirs) -> list[HFMember]:
    """One tiny member per tokenizer family, in testbed order (bpe, spm, word)."""
    return [HFMember.load(tiny_dirs[name], device="cpu") for name in MODEL_ORDER]


def _trained() -> bool:
    return all((path / "model.safetensors").is_file() for path in model_paths())


needs_trained = pytest.mark.skipif(
    not _trained(), reason="shipped models not built yet: run python -m lab.testbed.build"
)


@pytest.fixture(scope="session")
def shipped_members() -> list[HFMember]:
    if not _trained():
        pytest.skip("shipped models not built yet: run python -m lab.testbed.build")
    return [HFMember.load(path, device="cpu") for path in model_paths()]


@pytest.fixture(scope="session")
def make_ensemble(shipped_members):
    """Ensembles over the shipped members, sharing the loaded models between tests."""

    def build(method: str, members=None, **options) -> Ensemble:
        chosen = shipped_members if members is None else [shipped_members[i] for i in members]
        return Ensemble(list(chosen), method, **options)

    return build


@pytest.fixture
def recorder():
    """Every LlamaIndex instrumentation event, from a handler on the root dispatcher."""
    from llama_index.core.instrumentation import get_dispatcher
    from llamaindex_recorder import Recorder

    handler = Recorder(events=[])
    root = get_dispatcher()
    root.add_event_handler(handler)
    yield handler
    root.event_handlers.remove(handler)


class LoopProbe:
    """An `on_event` listener proving that the event loop runs WHILE the engine computes.

    Events are emitted from inside the engine's computation. At each one the probe asks the
    loop to run a callback and waits for it before letting the engine go on: a loop that the
    engine blocks (computing on the loop's own thread) cannot run it until the engine returns,
    so the wait fails. Ordering, not timing: `timeout` only keeps a broken build from hanging.
    Build it inside the running loop."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.loop = asyncio.get_running_loop()
        self.timeout = timeout
        self.ran: list[bool] = []  # per event: the loop ran our callback mid-computation

    def __call__(self, event) -> None:
        if self.ran and not self.ran[-1]:
            return  # already disproven: do not wait again
        ran = threading.Event()
        self.loop.call_soon_threadsafe(ran.set)
        self.ran.append(ran.wait(self.timeout))

    @property
    def proven(self) -> bool:
        return bool(self.ran) and all(self.ran)


async def cancel_midway(ens: Ensemble, messages: list[dict]) -> bool:
    """Cancels a task that streams `messages` once its first delta has come; True when the
    request's slot is free again (the worker thread notices at its next forward pass; the
    timeout only keeps a broken build from hanging)."""
    from core import GenerationConfig

    started = asyncio.Event()

    async def consume() -> None:
        async for _ in ens.astream(messages, GenerationConfig(max_new_tokens=200)):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return await asyncio.to_thread(ens.admission.wait_until, lambda: ens.admission.running == 0, 60)


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str):
    """An example script as a module (what the tests of the examples run)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic resolves the example's annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def served(shipped_members):
    """`llm-ensembling serve` over SAFE on the shipped members, in a thread of this process:
    (base URL, app, the ensemble it serves)."""
    from serve_helpers import running_server

    ensemble = Ensemble(list(shipped_members), "safe")
    with running_server(lambda: ensemble) as (url, app):
        yield url, app, ensemble


@pytest.fixture
def bodies():
    """The request bodies an HTTP client sends, recorded (`serve_helpers.Bodies`)."""
    from serve_helpers import Bodies

    return Bodies()


@pytest.fixture(autouse=True)
def _sigint_left_as_found():
    """A test that leaves another SIGINT handler behind fails (and the handler is put back), so
    no later test in the process, nor Ctrl-C, meets it."""
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"the test left SIGINT handled by {after!r} (it was {before!r})")
