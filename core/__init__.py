"""llm-ensembling core: several local causal LMs answering as one (SAFE, SpecEM, baselines).

The engine imports neither LangChain nor LlamaIndex; the adapters wrap it.
"""

from .config import Delta, GenerationConfig, Output, Stats
from .ensemble import Ensemble
from .errors import (
    ChatTemplateError,
    ContextWindowError,
    EnsembleBusyError,
    EnsembleError,
    InvalidConfigError,
    InvalidMessagesError,
    MemberError,
    MissingWeightsError,
    ModelLoadError,
    ModelNotFoundError,
    NotCausalLMError,
    RequestCancelled,
    ServerError,
    TokenizerMismatchError,
)
from .hf_member import HFMember
from .local import Local
from .member import Draft, Member
from .remote import Remote, RemoteMember
from .version import __version__

__all__ = [
    "ChatTemplateError",
    "ContextWindowError",
    "Delta",
    "Draft",
    "Ensemble",
    "EnsembleBusyError",
    "EnsembleError",
    "GenerationConfig",
    "HFMember",
    "InvalidConfigError",
    "InvalidMessagesError",
    "Local",
    "Member",
    "MemberError",
    "MissingWeightsError",
    "ModelLoadError",
    "ModelNotFoundError",
    "NotCausalLMError",
    "Output",
    "Remote",
    "RemoteMember",
    "RequestCancelled",
    "ServerError",
    "Stats",
    "TokenizerMismatchError",
    "__version__",
]
