"""A chat that keeps the target's KV cache between turns.

An agent re-sends its whole conversation every turn: system prompt, tool
definitions, every earlier turn.  :class:`Conversation` keeps the target's
``DynamicCache`` and the token ids it holds; each :meth:`Conversation.reply`

1. renders the whole conversation with the chat template and tokenizes it
   (exactly the prompt a fresh call would see),
2. keeps the longest common prefix of those ids and the cached ids, crops the
   cache to it (an edited earlier message, or a template that renders earlier
   turns differently once later ones exist, invalidates exactly the suffix
   that changed), and
3. generates with :func:`grammarspec.generate` on that cache, so only the
   tokens the template added are prefilled.

The prompt is the same as a fresh call's, so greedy output is the same as a
fresh ``generate`` on the full conversation (up to floating-point ties: keys
computed in chunks may differ from one prompt pass in the last bits), and
sampling keeps its exact distribution.

Proposers: one proposer object per conversation (``assistant=`` is resolved
once) and ``start`` once per turn, with that turn's prompt: every turn is a
new generation with its own prompt and grammar.  What the drafters learn
from earlier turns reaches them through the context, which holds every
earlier turn (prompt lookup reads all of it), and through two carries:

* :attr:`Conversation.calibration`, one :class:`~grammarspec.policy.allocation.Calibration`
  for the whole conversation (the survival records that size each row's
  drafts): turn 2 starts from what turn 1 learned;
* the earlier assistant messages' JSON (tool calls, JSON answers:
  :func:`grammarspec.tool_calls.earlier_documents`) as ``Request.documents``, which
  the schema n-gram drafter reads as history (``past`` / ``past_value``).

Both are drafting policy only: they change which tokens are verified, never
the output distribution.  A draft model keeps its KV cache across ``start``
and re-syncs by common prefix (``proposers/draft_model.py``).  The members'
own per-request records (the composite's tracks, the schema n-gram's source
scores) are still reset by ``start``.

Memory is bounded by ``max_context`` tokens (default: the model's
``max_position_embeddings``): a turn whose prompt plus ``max_new_tokens``
would not fit raises :class:`ContextLimitError` before any work; drop or
shorten messages in :attr:`Conversation.messages` and call again (the cache
is cropped to what still matches).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grammars.registry import DEFAULT as DEFAULT_BACKEND
from grammarspec.api import DEFAULT_MAX_DRAFT, check_options, run_generate
from grammarspec.completion import AssistantMessage
from grammarspec.constraint import Constraint
from grammarspec.drafting.assistant import draft_maker
from grammarspec.kv.cache import cache_length, common_prefix_length, crop_cache, new_cache
from grammarspec.policy.allocation import Calibration
from grammarspec.stats import GenerationStats
from grammarspec.tool_calls import (
    NO_TOOL_NOTE,
    ToolCallError,
    check_tools,
    earlier_documents,
    parse_cut_reply,
    parse_tool_reply,
    prompt_text,
    template_renders_tools,
    tool_format_for,
)
from proposers.presets import resolve_assistant
from proposers.suffix_index import resolve_index

#: The constraint keywords ``reply`` takes besides ``tool_choice`` / ``parallel_tool_calls``.
_CONSTRAINT_KWARGS = ("schema", "grammar", "regex", "json_object", "any_whitespace")

__all__ = [
    "CONVERSATION_DRAFT_BYTES",
    "NO_TOOL_NOTE",
    "ContextLimitError",
    "Conversation",
    "Reply",
    "common_prefix_length",
    "describes_tools",
    "prompt_ids",
]

#: Bytes of a conversation's own index of earlier outputs (``draft_index=None``).
CONVERSATION_DRAFT_BYTES = 16 << 20


def describes_tools(tokenizer: Any, tools: Sequence[Mapping[str, Any]] | None, tool_format: str) -> bool:
    """Whether the prompt describes ``tools`` in the system message: a model format whose chat template drops
    ``tools=`` (SmolLM2's does), so the model would not see them otherwise.  Pure."""
    return bool(tools) and tool_format != "json" and not template_renders_tools(tokenizer, tools or [])


def prompt_ids(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_format: str = "json",
    tool_choice: Any = "auto",
    *,
    describe: bool | None = None,
) -> list[int]:
    """The token ids of ``messages`` as the chat template renders them, the assistant turn opened.  Pure.

    The one prompt building of :class:`Conversation` and ``grammarspec serve``
    (:func:`~grammarspec.tool_calls.prompt_text`, then the tokenizer), so a
    conversation sent to the server reads exactly the prompt it reads in
    process.  ``describe``: whether the tools are described in the system
    message (``None``: :func:`describes_tools`).
    """
    if describe is None:
        describe = describes_tools(tokenizer, tools, tool_format)
    text = prompt_text(tokenizer, messages, tools, tool_format, tool_choice, describe=describe)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class ContextLimitError(ValueError):
    """The conversation (plus the tokens asked for) does not fit in ``max_context``."""


@dataclass
class Reply(AssistantMessage):
    """One assistant turn: the OpenAI message and what it took."""

    message: dict[str, Any]  # {"role": "assistant", "content": str | None, "tool_calls": [...]?}
    finish_reason: str  # OpenAI's: "tool_calls", "stop" or "length"
    stats: GenerationStats
    tokens: list[int]  # generated token ids (the stop token included)
    prompt_tokens: int  # the templated conversation
    reused_tokens: int  # prompt tokens whose keys/values came from the cache
    seconds: float  # wall clock of the turn (template, tokenize, generate, parse)

    @property
    def prefilled_tokens(self) -> int:
        """Prompt tokens the target read this turn."""
        return self.prompt_tokens - self.reused_tokens


class Conversation:
    """Messages in the OpenAI chat format plus the target's KV cache over them.

    ``tools``: OpenAI-style definitions offered in every turn (``tool_choice``
    per turn picks among them).  ``system``: a system message to start with.
    ``tool_format``: ``"auto"`` (the template's native format, else
    ``"json"``), ``"json"`` or an xgrammar model format (see
    :mod:`grammarspec.tool_calls`).  ``assistant``/``max_draft_tokens``/
    ``grammar_backend``: as for :func:`grammarspec.generate`.
    ``draft_index``: with ``assistant="auto"``, each turn also drafts from what
    earlier turns wrote under the same tools or schema (:class:`proposers.SuffixIndex`):
    ``None`` gives the conversation its own (:data:`CONVERSATION_DRAFT_BYTES`): another
    conversation's values (an earlier order number, a city) are confident wrong
    guesses here, measured to cost more passes than they save; an index passed in
    is shared (by an agent's many conversations, say), ``False`` turns it off.
    Outputs are unchanged.
    ``generation_kwargs``: defaults for every turn (``do_sample``, ...).

    Not thread-safe; one conversation per thread.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        system: str | None = None,
        assistant: Any = "auto",
        max_context: int | None = None,
        tool_format: str = "auto",
        max_draft_tokens: int = DEFAULT_MAX_DRAFT,
        grammar_backend: str = DEFAULT_BACKEND,
        draft_index: Any = None,
        **generation_kwargs: Any,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("Conversation needs a tokenizer with a chat template (tokenizer.chat_template is empty)")
        check_tools(tools)
        self.model, self.tokenizer = model, tokenizer
        self.tools = [dict(t) for t in tools] if tools else None
        self.tool_format = tool_format_for(tokenizer, tool_format)
        limit = max_context if max_context is not None else getattr(model.config, "max_position_embeddings", None)
        if limit is not None and (not isinstance(limit, int) or limit < 2):
            raise ValueError(f"max_context must be an int >= 2 (tokens), got {max_context!r}")
        self.max_context: int | None = limit
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        self.replies: list[Reply] = []
        self._assistant = assistant
        #: earlier outputs this conversation drafts from (None: off); it keeps the one proposer it feeds
        self.draft_index = resolve_index(draft_index, CONVERSATION_DRAFT_BYTES, "Conversation()")
        self._proposer = resolve_assistant(  # one per conversation
            assistant, make_draft=draft_maker(), suffix_index=self.draft_index
        )
        self._options = dict(max_draft_tokens=max_draft_tokens, grammar_backend=grammar_backend, **generation_kwargs)
        # a bad default fails here, not at reply()
        check_options(
            model, {k: v for k, v in self._options.items() if k not in _CONSTRAINT_KWARGS}, where="Conversation()"
        )
        self._describe_tools = describes_tools(tokenizer, self.tools, self.tool_format)
        if self._describe_tools:
            warnings.warn(
                f"the chat template ignores tools=, so with tool_format={self.tool_format!r} the model would never "
                "see the tool definitions; grammarspec describes them in the system message instead (or pass "
                "tool_format='json')",
                UserWarning,
                stacklevel=2,
            )
        self._cache = new_cache(model)
        self._cached: list[int] = []  # the token ids whose keys/values the cache holds
        #: The drafts' survival records, carried from turn to turn (each turn's row updates it in place).
        self.calibration = Calibration()
        self._calls = 0

    # --- messages (these change the conversation, never the cache) ---------------------------

    def add_user(self, content: str) -> None:
        """Append a user message (``content``: a string).  A bad one is refused and nothing is appended."""
        if not isinstance(content, str):
            raise ValueError(f"add_user(content) must be a string, got {type(content).__name__}: {content!r:.60}")
        self.messages.append({"role": "user", "content": content})

    def add_tool_result(self, tool_call_id: str, content: Any) -> None:
        """Append a ``tool`` message answering the call ``tool_call_id`` (content: a string or JSON value).

        A content that is neither is refused and nothing is appended.
        """
        known = {c["id"] for m in self.messages for c in m.get("tool_calls") or []}
        if tool_call_id not in known:
            raise ToolCallError(f"no tool call has id {tool_call_id!r}; answer one of {sorted(known)}")
        if not isinstance(content, str):
            try:
                json.dumps(content, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise ValueError(
                    f"add_tool_result(content) must be a string or a JSON value (dict, list, str, number, bool, "
                    f"None), got {type(content).__name__}: {e}"
                ) from None
        self.messages.append({"role": "tool", "tool_call_id": tool_call_id, "content": content})

    # --- the prompt --------------------------------------------------------------------------

    def prompt_ids(
        self, messages: Sequence[Mapping[str, Any]] | None = None, *, tool_choice: Any = "auto"
    ) -> list[int]:
        """Token ids of the templated conversation with the assistant turn opened.  Does not change state.

        ``tool_choice="none"``: no tool is offered, so nothing asks for a call
        format: the conversation renders as without tools (earlier calls and
        results stay) and the last user message tells the model to answer in
        plain text (:data:`NO_TOOL_NOTE`; not kept in :attr:`messages`).  The
        prompt then differs from an ``"auto"`` turn's where the tools were
        described, so such a turn reuses the cache only up to there.
        """
        chat = self.messages if messages is None else messages
        return prompt_ids(
            self.tokenizer, chat, self.tools, self.tool_format, tool_choice, describe=self._describe_tools
        )

    @property
    def cached_tokens(self) -> int:
        """How many leading tokens of the last prompt + reply the target's cache holds."""
        return len(self._cached)

    def reset_cache(self) -> None:
        """Forget the KV cache (the messages stay).  Changes state."""
        self._cache, self._cached = new_cache(self.model), []

    # --- a turn ------------------------------------------------------------------------------

    def reply(
        self,
        *,
        tool_choice: Any = "auto",
        parallel_tool_calls: bool = False,
        max_new_tokens: int = 256,
        append: bool = True,
        **generation_kwargs: Any,
    ) -> Reply:
        """Generate the next assistant message (and append it to :attr:`messages` unless ``append=False``).

        ``tool_choice``: ``"auto"`` (text or a call), ``"required"``,
        ``"none"`` or ``{"type": "function", "function": {"name": ...}}``.
        A reply cut by ``max_new_tokens`` (``finish_reason="length"``) keeps a
        call whose name is complete as a call, with the arguments written so
        far (not parseable JSON), as OpenAI returns it; a call cut inside its
        name gives neither a call nor its text (``content`` is ``None``).
        Changes state: the cache and (with ``append``) the messages.  A turn whose
        own work fails (its grammar matcher or drafter raises) raises
        :class:`~grammarspec.GenerationError` and appends nothing; the next
        ``reply`` starts from the same messages.
        """
        t0 = time.perf_counter()
        options = {**self._options, **generation_kwargs}
        own = {name: options.pop(name) for name in _CONSTRAINT_KWARGS if name in options}
        check_options(self.model, {**options, "max_new_tokens": max_new_tokens}, where="reply()")
        constraint = Constraint(
            tools=self.tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls,
            tool_format=self.tool_format,
            **own,
        ).resolve()
        ids = self.prompt_ids(tool_choice=tool_choice)
        if self.max_context is not None and len(ids) + max_new_tokens > self.max_context:
            raise ContextLimitError(
                f"the conversation is {len(ids)} tokens and the turn may add {max_new_tokens}, more than "
                f"max_context={self.max_context}; drop or shorten earlier messages (conversation.messages), "
                "lower max_new_tokens, or start a new Conversation"
            )
        # Keep the cached prefix that the new prompt repeats; the model must read at least one token.
        keep = min(common_prefix_length(self._cached, ids), len(ids) - 1)
        crop_cache(self._cache, keep, "target model")
        self._cached = self._cached[:keep]
        out: Any = run_generate(
            self.model,
            ids,
            constraint,
            tokenizer=self.tokenizer,
            assistant=self._proposer if self._proposer is not None else None,
            max_new_tokens=max_new_tokens,
            return_dict_in_generate=True,
            past_key_values=self._cache,
            update_cache=True,
            calibration=self.calibration if self._proposer is not None else None,
            documents=earlier_documents(self.messages),
            **options,
        )
        stats = out.stats[0]
        new = out.sequences[0, len(ids) : len(ids) + stats.new_tokens].tolist()
        self._sync_cache(ids + new)
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        call_ids = [f"call_{self._calls + i}" for i in range(64)]
        offered = self.tools if tool_choice != "none" else None
        if stats.finish_reason in ("stop", "eos"):
            message = parse_tool_reply(text, offered, self.tool_format, call_ids)
        else:  # cut short: a call whose name is complete stays a call, with the arguments written so far
            message = parse_cut_reply(text, offered, self.tool_format, call_ids)
        self._calls += len(message.get("tool_calls") or [])
        if stats.finish_reason == "length":
            finish = "length"
        else:
            finish = "tool_calls" if "tool_calls" in message and stats.finish_reason in ("stop", "eos") else "stop"
        result = Reply(
            message=message,
            finish_reason=finish,
            stats=stats,
            tokens=new,
            prompt_tokens=len(ids),
            reused_tokens=keep,
            seconds=time.perf_counter() - t0,
        )
        if append:
            self.messages.append(message)
        self.replies.append(result)
        return result

    def _sync_cache(self, tokens: list[int]) -> None:
        """Record which ids the cache holds after a turn (a stop inside a draft may leave extra keys)."""
        held = cache_length(self._cache)
        if held > len(tokens):
            crop_cache(self._cache, len(tokens), "target model")
            held = len(tokens)
        self._cached = tokens[:held]
