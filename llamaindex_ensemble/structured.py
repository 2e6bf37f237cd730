"""Structured output through the engine's grammar: the output class's JSON schema is the
`response_format`, and the answer is read back with `model_validate_json`."""

from __future__ import annotations

from typing import Any

from llama_index.core.base.llms.types import ChatResponse
from pydantic import BaseModel, ValidationError

from core.errors import InvalidConfigError


def structured_kwargs(output_cls: type[BaseModel], llm_kwargs: dict[str, Any] | None) -> dict:
    """`chat`'s keyword arguments for an answer of `output_cls`."""
    if not (isinstance(output_cls, type) and issubclass(output_cls, BaseModel)):
        raise InvalidConfigError(
            f"output_cls must be a pydantic model class, got {output_cls!r}; define a "
            "class Answer(BaseModel): ... and pass Answer."
        )
    return {**(llm_kwargs or {}), "response_format": output_cls.model_json_schema()}


def structured_result(output_cls: type[BaseModel], response: ChatResponse) -> BaseModel:
    """The answer as an `output_cls`; an answer cut off by max_new_tokens says so."""
    text = response.message.content or ""
    try:
        return output_cls.model_validate_json(text)
    except ValidationError as error:
        if response.raw.get("finish_reason") != "length":
            raise
        raise ValueError(
            f"the answer reached max_new_tokens before its JSON was complete ({text[:60]!r}...); "
            "raise max_new_tokens (EnsembleLLM(max_new_tokens=...), or "
            "llm_kwargs={'max_new_tokens': ...})."
        ) from error
