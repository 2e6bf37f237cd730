"""LangChain adapter: `ChatEnsemble`, a `BaseChatModel` over the ensemble engine (`core`)."""

from .chat_model import ChatEnsemble

__all__ = ["ChatEnsemble"]
