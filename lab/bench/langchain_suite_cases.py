"""LangChain's standard chat-model integration suite over one configuration of `ChatEnsemble`,
as `python -m lab.bench.langchain_suite` runs it (a pytest module: that runner passes the
configuration in `SUITE_ENV` and reads the outcomes from pytest's JUnit XML).

Every test gets the same `max_tokens`: room for a tool call or a JSON answer, which a chat
answer that ends sooner does not spend. The suite is LangChain's own, unchanged; nothing here is
marked xfail, since the runner records what passes and what fails, with the assertion.
"""

from __future__ import annotations

import functools
import json
import os

import pytest
import torch
from langchain_tests.integration_tests import ChatModelIntegrationTests

from langchain_ensemble import ChatEnsemble

SUITE_ENV = "LLM_ENSEMBLING_SUITE"  # {"models": [...], "method": ..., "method_options": {...}}


@functools.cache
def suite_params() -> dict:
    """The configuration the runner passed, read once: the members (paths, or the real pair's
    `Local` specs), the method and its options, and max_tokens; torch threads are set here."""
    config = json.loads(os.environ[SUITE_ENV])
    torch.set_num_threads(config.pop("threads", 1))
    if config.pop("real", False):
        from core.testbed.real_models import real_members

        config["models"] = real_members()
    return {"device": "cpu", **config}


class TestStandardSuite(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatEnsemble]:
        return ChatEnsemble

    @property
    def chat_model_params(self) -> dict:
        return dict(suite_params())

    @property
    def supports_json_mode(self) -> bool:
        return True

    @pytest.fixture
    def model(self, request) -> ChatEnsemble:
        """The suite's own fixture, with this configuration's max_tokens kept (the suite sets
        its own otherwise)."""
        params = {**self.standard_chat_model_params, **self.chat_model_params}
        params.update(getattr(request, "param", None) or {})
        params["max_tokens"] = suite_params()["max_tokens"]
        return ChatEnsemble(**params)
