"""grammarspec: exact schema-constrained speculative decoding for Hugging Face models.

The output distribution equals ordinary constrained sampling from the target
model with the same grammar and generation settings; greedy output equals
constrained greedy decoding.  Speculation only changes how fast it comes.
"""

from grammars import GrammarError

from .api import GenerationOutput, enable, generate
from .completion import Completion, build_prompt, complete
from .conversation import ContextLimitError, Conversation, Reply
from .isolation import GenerationError
from .kv_cache import CacheError
from .loading import ModelNotFoundError, load_model, load_tokenizer
from .sampling import SamplingParams
from .stats import GenerationStats
from .tool_calls import ToolCallError

__all__ = [
    "generate",
    "enable",
    "complete",
    "Conversation",
    "Reply",
    "ContextLimitError",
    "GenerationError",
    "ToolCallError",
    "build_prompt",
    "Completion",
    "GenerationOutput",
    "GenerationStats",
    "SamplingParams",
    "GrammarError",
    "CacheError",
    "ModelNotFoundError",
    "load_model",
    "load_tokenizer",
]

__version__ = "0.1.0"
