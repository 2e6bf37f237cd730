"""LangChain's standard chat-model suites, against the real engine on the shipped models.

One unit class and one integration class per method present in this build (a method module
added later is covered without editing this file). Tool calling is off (`has_tool_calling`
False) until the ensemble can call tools; the suites then skip their tool tests by that flag.
"""

from __future__ import annotations

import importlib.util

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from core.methods import METHOD_NAMES
from core.testbed import model_paths
from langchain_ensemble import ChatEnsemble

METHODS = [m for m in METHOD_NAMES if importlib.util.find_spec(f"core.methods.{m}")]
MAX_TOKENS = 8  # keeps ~25 requests per method fast on CPU
# The suites assert a non-empty answer to "Hello". tb-gpt2-bpe, trained on arithmetic problems
# only, ends its turn at once on a greeting, and with it in the ensemble `token` and `safe`
# agree to stop there: an honest empty answer. So the suites run on the two other shipped
# models (still two tokenizer families: SentencePiece-style and word-level).
MODELS = [str(p) for p in model_paths()[1:]]


def _params(method: str) -> dict:
    return {"models": MODELS, "method": method, "device": "cpu"}


@pytest.fixture(scope="module", autouse=True)
def loaded_engines():
    """The suites build a new model per test; holding one per method keeps the shared engine
    loaded between tests instead of reloading it every time."""
    return [ChatEnsemble(**_params(m)).ensemble for m in METHODS]


class _Setup:
    method = "token"

    @property
    def chat_model_class(self) -> type[ChatEnsemble]:
        return ChatEnsemble

    @property
    def chat_model_params(self) -> dict:
        return _params(self.method)

    @property
    def has_tool_calling(self) -> bool:
        return False


class _Generating(_Setup):
    @property
    def chat_model_params(self) -> dict:
        # Only here: the unit suite passes its own max_tokens next to these params.
        return {**_params(self.method), "max_tokens": MAX_TOKENS}


for _method in METHODS:
    _label = _method.capitalize()
    globals()[f"TestChatEnsemble{_label}Unit"] = type(
        f"TestChatEnsemble{_label}Unit", (_Setup, ChatModelUnitTests), {"method": _method}
    )
    globals()[f"TestChatEnsemble{_label}Integration"] = type(
        f"TestChatEnsemble{_label}Integration",
        (_Generating, ChatModelIntegrationTests),
        {"method": _method},
    )
