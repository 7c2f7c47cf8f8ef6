"""The agent-loop benchmark: whole multi-turn tool-calling conversations, three arms, interleaved.

Arms (greedy, the same prompts, the same grammar per turn, the same tools):

* ``hf_resend`` -- Hugging Face ``generate`` + xgrammar's HF logits processor,
  re-sending the whole conversation every turn (what agent code does today);
* ``hf_cache`` -- the same with a reused prompt cache: one ``DynamicCache``
  kept across turns, cropped to the longest prefix the new prompt repeats
  (the strongest plain transformers set-up);
* ``conversation`` -- :class:`grammarspec.Conversation` with ``assistant="auto"``.

Every arm renders the conversation the same way (:meth:`Conversation.prompt_ids`),
reads replies the same way (:func:`grammarspec.tool_calls.parse_tool_reply`) and
runs the same Python tools (:mod:`.agent_tasks`).  The time of a conversation
is the wall clock from its first model turn to its last (tool calls and
templating included, grammars compiled before).  Arms run back to back per
conversation and repeat, in an order that rotates.  Tool calls and every
generated token are compared across arms.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from grammarspec.bench.agent_tasks import CONVERSATIONS, SYSTEM, TOOLS, ModelTurn, run_tool
from grammarspec.conversation import Conversation, common_prefix_length
from grammarspec.drafting.earlier_outputs import SHARED_DRAFT_BYTES
from grammarspec.engine.decoding import logits_width
from grammarspec.kv.cache import cache_length, crop_cache, new_cache
from grammarspec.tool_calls import parse_tool_reply, tool_constraint
from proposers.suffix_index import SuffixIndex

__all__ = ["AGENT_ARMS", "ConversationRun", "TurnRecord", "agent_markdown", "run_agent_bench"]

AGENT_ARMS = ("hf_resend", "hf_cache", "conversation")


@dataclass
class TurnRecord:
    tokens: list[int]  # generated, the stop token included
    prompt_tokens: int
    prefilled: int  # prompt tokens the target read this turn
    calls: list[tuple[str, str]]  # (name, arguments JSON)
    target_forwards: int | None = None  # grammarspec only


@dataclass
class ConversationRun:
    conversation: str
    arm: str
    repeat: int
    seconds: float
    turns: list[TurnRecord] = field(default_factory=list)

    @property
    def generated(self) -> int:
        return sum(len(t.tokens) for t in self.turns)


class _Grammars:
    """xgrammar's own compiled grammars for the HF arms, one per turn constraint (compiled before timing)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=[tokenizer.eos_token_id]
        )
        self._compiler = xgr.GrammarCompiler(info)
        self._compiled: dict[str, Any] = {}

    def get(self, constraint: dict[str, Any]) -> Any:
        """The compiled grammar of a :func:`tool_constraint` result (``None``: free text)."""
        if not constraint:
            return None
        key = json.dumps(constraint, sort_keys=True)
        if key not in self._compiled:
            from grammars import tools_schema

            if "grammar" in constraint:
                self._compiled[key] = self._compiler.compile_grammar(constraint["grammar"])
            else:
                schema = tools_schema(constraint["tools"], parallel=constraint["parallel_tool_calls"])
                self._compiled[key] = self._compiler.compile_json_schema(
                    json.dumps(schema), any_whitespace=False, separators=(",", ":")
                )
        return self._compiled[key]


def _hf_turn(model: torch.nn.Module, ids: list[int], compiled: Any, max_new: int, eos: int, cache: Any) -> list[int]:
    """One Hugging Face ``generate`` call (greedy) with xgrammar's processor; returns the new tokens."""
    from transformers import LogitsProcessorList
    from xgrammar.contrib.hf import LogitsProcessor

    processors = LogitsProcessorList([LogitsProcessor(compiled)] if compiled is not None else [])
    input_ids = torch.tensor([ids], dtype=torch.long)
    extra = {"past_key_values": cache} if cache is not None else {}
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            logits_processor=processors,
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
            **extra,
        )
    new = out[0, len(ids) :].tolist()
    return new[: new.index(eos) + 1] if eos in new else new


def play(
    model: torch.nn.Module,
    tokenizer: Any,
    script: list[Any],
    arm: str,
    grammars: _Grammars,
    draft_index: Any = None,
) -> tuple[float, list[TurnRecord]]:
    """Run one conversation under one arm; returns ``(seconds, turns)``.  ``draft_index``: the earlier outputs
    ``Conversation`` drafts from (``False``: none)."""
    conv = Conversation(model, tokenizer, tools=TOOLS, system=SYSTEM, assistant="auto", draft_index=draft_index)
    eos = tokenizer.eos_token_id
    cache = new_cache(model) if arm == "hf_cache" else None
    cached: list[int] = []
    records: list[TurnRecord] = []
    started = time.perf_counter()
    for step in script:
        if isinstance(step, str):
            conv.add_user(step)
            continue
        assert isinstance(step, ModelTurn)
        if arm == "conversation":
            reply = conv.reply(tool_choice=step.tool_choice, max_new_tokens=step.max_new_tokens)
            message, tokens = reply.message, reply.tokens
            record = TurnRecord(tokens, reply.prompt_tokens, reply.prefilled_tokens, [], reply.stats.target_forwards)
        else:
            ids = conv.prompt_ids(tool_choice=step.tool_choice)  # rendered as the conversation arm renders it
            constraint = tool_constraint(TOOLS, step.tool_choice, False, conv.tool_format)
            keep = 0
            if cache is not None:
                keep = min(common_prefix_length(cached, ids), len(ids) - 1)
                crop_cache(cache, keep)
            tokens = _hf_turn(model, ids, grammars.get(constraint), step.max_new_tokens, eos, cache)
            if cache is not None:
                cached = (ids + tokens)[: cache_length(cache)]
            message = _message(tokenizer, conv, tokens, eos, constraint)
            conv.messages.append(message)
            record = TurnRecord(tokens, len(ids), len(ids) - keep, [])
        for call in message.get("tool_calls") or []:
            function = call["function"]
            record.calls.append((function["name"], function["arguments"]))
            conv.add_tool_result(call["id"], _tool_result(function["name"], function["arguments"]))
        records.append(record)
    return time.perf_counter() - started, records


def _tool_result(name: str, arguments: str) -> Any:
    """What the tool answers: its result, or an error where a call cut by the token limit left its arguments
    unfinished (an agent cannot run such a call; it says so, as the tool's answer)."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return {"error": "the call was cut off by the token limit; its arguments are incomplete"}
    return run_tool(name, parsed)


def _message(tokenizer: Any, conv: Conversation, tokens: list[int], eos: int, constraint: dict[str, Any]) -> dict:
    """The assistant message for a baseline turn, read exactly as :meth:`Conversation.reply` reads its own."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    if not tokens or tokens[-1] != eos:
        return {"role": "assistant", "content": text}
    done = sum(len(m.get("tool_calls") or []) for m in conv.messages)
    tools = (constraint.get("tools") or conv.tools) if constraint else None
    return parse_tool_reply(text, tools, conv.tool_format, [f"call_{done + i}" for i in range(64)])


def run_agent_bench(
    model: torch.nn.Module,
    tokenizer: Any,
    *,
    conversations: dict[str, list[Any]] | None = None,
    arms: tuple[str, ...] = AGENT_ARMS,
    repeat: int = 1,
    progress: Callable[[str], None] = lambda line: None,
) -> list[ConversationRun]:
    """Every conversation under every arm, ``repeat`` times, interleaved; one record per conversation run."""
    conversations = conversations or CONVERSATIONS
    grammars = _Grammars(tokenizer, logits_width(model))
    # Compile every grammar before timing (both grammarspec's cache and the baseline's).
    from grammars import compile_grammar, grammar_spec

    for script in conversations.values():
        for step in script:
            if isinstance(step, ModelTurn):
                constraint = tool_constraint(TOOLS, step.tool_choice, False, "json")
                grammars.get(constraint)
                spec = grammar_spec(**constraint)
                if spec is not None:
                    compile_grammar(
                        spec, tokenizer, vocab_size=logits_width(model), stop_token_ids=(tokenizer.eos_token_id,)
                    )
    first = next(iter(conversations.values()))
    for arm in arms:  # warm-up: one untimed short conversation per arm
        play(model, tokenizer, first[:2] + [ModelTurn("required", 8)], arm, grammars, False)
    runs: list[ConversationRun] = []
    for r in range(repeat):
        # Each repeat is one pass over the conversations, as an agent's process holds them in turn: the
        # conversations draft from the earlier ones' turns, never from their own earlier repeats.
        earlier = SuffixIndex(SHARED_DRAFT_BYTES)
        for i, (name, script) in enumerate(conversations.items()):
            shift = (i + r) % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                seconds, turns = play(model, tokenizer, script, arm, grammars, earlier)
                runs.append(ConversationRun(name, arm, r, seconds, turns))
                progress(f"{name} #{r} {arm}: {seconds:.1f}s, {sum(len(t.tokens) for t in turns)} tokens")
    return runs


def agent_markdown(runs: list[ConversationRun], command: str) -> str:
    """The results table (per conversation and overall) and the agreement check, as markdown."""
    arms = [a for a in AGENT_ARMS if any(run.arm == a for run in runs)]
    names = list(dict.fromkeys(run.conversation for run in runs))
    by = {(run.conversation, run.arm, run.repeat): run for run in runs}
    lines = [
        f"`{command}`",
        "",
        (
            "| conversation | model turns | tool calls | generated | prompt tokens (sum) | prefilled: resend / cache / conv "
            "| tokens per target pass (conv) | seconds: resend / cache / conv | speedup vs resend | vs cache | identical |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    totals = {a: 0.0 for a in arms}
    ratios: dict[str, list[float]] = {"hf_resend": [], "hf_cache": []}
    for name in names:
        repeats = sorted({run.repeat for run in runs if run.conversation == name})
        secs = {a: statistics.median(by[(name, a, r)].seconds for r in repeats) for a in arms}
        for a in arms:
            totals[a] += secs[a]
        ref = by[(name, arms[-1], repeats[0])]
        same = all(
            [t.tokens for t in by[(name, a, r)].turns] == [t.tokens for t in ref.turns] for a in arms for r in repeats
        )
        prefilled = " / ".join(str(sum(t.prefilled for t in by[(name, a, repeats[0])].turns)) for a in arms)
        conv = by.get((name, "conversation", repeats[0]))
        per_pass = f"{conv.generated / max(1, sum(t.target_forwards or 0 for t in conv.turns)):.2f}" if conv else "-"
        speed = {b: secs[b] / secs["conversation"] for b in ratios if b in secs and "conversation" in secs}
        for b, value in speed.items():
            ratios[b].append(value)
        lines.append(
            f"| {name} | {len(ref.turns)} | {sum(len(t.calls) for t in ref.turns)} | {ref.generated} "
            f"| {sum(t.prompt_tokens for t in ref.turns)} | {prefilled} | {per_pass} "
            f"| {' / '.join(f'{secs[a]:.2f}' for a in arms)} | {_x(speed.get('hf_resend'))} | {_x(speed.get('hf_cache'))} "
            f"| {'yes' if same else 'NO'} |"
        )
    if "conversation" in totals:
        whole = {b: totals[b] / totals["conversation"] for b in ratios if b in totals}
        lines.append(
            f"| **all** | | | | | | | {' / '.join(f'{totals[a]:.2f}' for a in arms)} "
            f"| {_x(whole.get('hf_resend'))} | {_x(whole.get('hf_cache'))} | |"
        )
    lines += ["", "Calls per conversation (first repeat, the conversation arm):", ""]
    for name in names:
        ref = by[(name, arms[-1], 0)]
        calls = [f"{n}({a})" for t in ref.turns for n, a in t.calls]
        lines.append(f"- {name}: {'; '.join(calls) or 'none'}")
    return "\n".join(lines) + "\n"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"
