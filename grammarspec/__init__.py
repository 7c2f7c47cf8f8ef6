"""grammarspec: exact schema-constrained speculative decoding for Hugging Face models.

The output distribution equals ordinary constrained sampling from the target
model with the same grammar and generation settings; greedy output equals
constrained greedy decoding.  Speculation only changes how fast it comes.
"""

from grammars import GrammarError
from grammarspec.api import GenerationOutput, enable, generate
from grammarspec.completion import Completion, build_prompt, complete
from grammarspec.conversation import ContextLimitError, Conversation, Reply
from grammarspec.drafting.earlier_outputs import forget_earlier_outputs
from grammarspec.engine.isolation import GenerationError
from grammarspec.engine.sampling import SamplingParams
from grammarspec.kv.cache import CacheError
from grammarspec.model.loading import ModelNotFoundError, load_model, load_tokenizer
from grammarspec.stats import GenerationStats
from grammarspec.tool_calls import ToolCallError

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
    "forget_earlier_outputs",
]

__version__ = "0.1.0"
