"""A LlamaIndex instrumentation handler on the root dispatcher that keeps every event, for the
LlamaIndex adapter's tests (the `recorder` fixture in conftest.py attaches one)."""

from __future__ import annotations

from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent


class Recorder(BaseEventHandler):
    events: list = []

    @classmethod
    def class_name(cls) -> str:
        return "Recorder"

    def handle(self, event: BaseEvent, **kwargs) -> None:
        self.events.append(event)

    def of(self, cls) -> list:
        return [e for e in self.events if isinstance(e, cls)]
