"""A tool-calling agent on the embedded model, in one conversation that keeps its KV cache.

The model sees OpenAI-style tool definitions (weather, calculator, calendar,
and ``final_answer``) and writes one call per turn: ``tool_choice="required"``
makes every reply a call the grammar checks (a known tool, arguments that
follow its JSON Schema).  The Python function runs, its result goes back as a
``tool`` message answering the call's id, and the loop goes on until the model
calls ``final_answer``.  On the last allowed step (or after the model repeats
a call) ``tool_choice`` names ``final_answer``, whose answer is at most 160
characters, so every question ends with an answer.

Each question gets its own :class:`grammarspec.Conversation` (this small
model, seeing an earlier question's calls, repeats them): each turn prefills
only the tokens the chat template adds (the system prompt, the tool
definitions and the earlier turns stay in the target's KV cache).  Every
turn prints how many prompt tokens were reused and prefilled, the tokens
per target pass and the time.

    .venv/bin/python examples/tool_agent.py "Calculate 17 * 23." "What is the weather in Oslo?"
    .venv/bin/python examples/tool_agent.py --quick         # one question, two steps at most (CI smoke test)

SmolLM2-135M is a very small model: expect valid calls, not always wise ones.
A valid call follows the tool's schema; that says nothing of whether it is
the right tool or the right answer.  The default questions are ones this
model answers correctly, and the run checks their answers.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import operator
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema

import grammarspec

# --- the tools: OpenAI-style definitions and the Python functions behind them -------------

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / ** % and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "Arithmetic expression"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add_event",
            "description": "Add an event to the user's calendar.",
            "parameters": {
                "type": "object",
                "properties": {
                    "title": {"type": "string"},
                    "date": {"type": "string", "format": "date", "description": "YYYY-MM-DD"},
                    "time": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"},
                },
                "required": ["title", "date", "time"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "list_events",
            "description": "List the events on the user's calendar for one day.",
            "parameters": {
                "type": "object",
                "properties": {"date": {"type": "string", "format": "date"}},
                "required": ["date"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "final_answer",
            "description": "Give the user the final answer. Call this when you know it.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "maxLength": 160}},
                "required": ["answer"],
            },
        },
    },
]

#: A small, fixed weather table (no network): city -> (celsius, conditions).
WEATHER = {"oslo": (4.0, "light rain"), "paris": (14.5, "sunny"), "tokyo": (18.0, "cloudy"), "lima": (21.0, "fog")}


def get_weather(city: str, unit: str) -> dict[str, Any]:
    known = WEATHER.get(city.strip().lower())
    if known is None:
        return {"error": f"no weather for {city!r}; known cities: {', '.join(c.title() for c in WEATHER)}"}
    celsius, conditions = known
    temperature = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32, 1)
    return {"city": city, "temperature": temperature, "unit": unit, "conditions": conditions}


_OPERATORS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculator(expression: str) -> dict[str, Any]:
    """Arithmetic only: the expression is parsed, never ``eval``-ed."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ValueError("exponent too large")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(f"unsupported syntax: {ast.dump(node)[:60]}")

    try:
        return {"expression": expression, "result": value(ast.parse(expression, mode="eval").body)}
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError) as e:
        return {"expression": expression, "error": str(e) or type(e).__name__}


class Calendar:
    """An in-memory calendar."""

    def __init__(self) -> None:
        self.events: list[dict[str, str]] = []

    def add_event(self, title: str, date: str, time: str) -> dict[str, Any]:
        try:
            dt.date.fromisoformat(date)
        except ValueError:
            return {"error": f"{date!r} is not a calendar date (YYYY-MM-DD)"}
        self.events.append({"title": title, "date": date, "time": time})
        that_day = len(self.list_events(date)["events"])
        return {"added": {"title": title, "date": date, "time": time}, "events_that_day": that_day}

    def list_events(self, date: str) -> dict[str, Any]:
        return {"date": date, "events": [e for e in self.events if e["date"] == date]}


# --- the agent loop -----------------------------------------------------------------------

SYSTEM = (
    "You are a helpful assistant that answers by calling tools. Call one tool at a time. "
    "When a tool result gives you what the user asked for, call final_answer with a short answer."
)


@dataclass
class Step:
    call: dict[str, Any]  # {"name": ..., "arguments": {...}}
    result: Any  # what the Python function returned (None for final_answer)
    stats: grammarspec.GenerationStats


@dataclass
class AgentRun:
    question: str
    steps: list[Step] = field(default_factory=list)
    answer: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)  # this question's OpenAI messages
    replies: list[grammarspec.Reply] = field(default_factory=list)


#: The default questions and a word their right answer contains (SmolLM2-135M gets these right).
KNOWN_ANSWERS = {"Calculate 17 * 23.": "391", "What is the weather in Oslo?": "rain"}


def is_right(question: str, answer: str | None) -> bool | None:
    """Whether ``answer`` is right for one of the default questions (``None`` for other questions)."""
    word = KNOWN_ANSWERS.get(question)
    if word is None:
        return None
    return answer is not None and word in answer.lower()


FINAL_ANSWER = {"type": "function", "function": {"name": "final_answer"}}


def new_conversation(model: Any, tokenizer: Any, assistant: Any = "auto") -> grammarspec.Conversation:
    return grammarspec.Conversation(model, tokenizer, tools=TOOLS, system=SYSTEM, assistant=assistant)


def turn_line(step: int, reply: grammarspec.Reply) -> str:
    """Per-turn statistics: prompt tokens reused / prefilled, tokens per target pass, time."""
    s = reply.stats
    return (
        f"[turn {step}] prompt {reply.prompt_tokens} tokens: {reply.reused_tokens} reused, {reply.prefilled_tokens} "
        f"prefilled; {s.new_tokens} new in {s.target_forwards} target passes "
        f"({s.new_tokens / max(1, s.target_forwards):.2f} per pass); {reply.seconds:.2f}s"
    )


def run_agent(
    model: Any,
    tokenizer: Any,
    question: str,
    *,
    conversation: grammarspec.Conversation | None = None,
    max_steps: int = 6,
    max_new_tokens: int = 96,
    assistant: Any = "auto",
    show: Callable[[str], None] = lambda text: None,
) -> AgentRun:
    """Ask ``question`` (in ``conversation``, or a new one), call tools until ``final_answer``; the transcript."""
    conv = conversation if conversation is not None else new_conversation(model, tokenizer, assistant)
    calendar = Calendar()
    functions: dict[str, Callable[..., Any]] = {
        "get_weather": get_weather,
        "calculator": calculator,
        "add_event": calendar.add_event,
        "list_events": calendar.list_events,
    }
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    conv.add_user(question)
    first = len(conv.messages) - 1
    run = AgentRun(question)
    answer_now = False
    for step in range(max_steps):
        answer_now = answer_now or step == max_steps - 1
        # A final answer is at most 160 characters, so its call always fits in the budget below.
        budget = max(max_new_tokens, 192) if answer_now else max_new_tokens
        reply = conv.reply(tool_choice=FINAL_ANSWER if answer_now else "required", max_new_tokens=budget)
        run.replies.append(reply)
        show(turn_line(step + 1, reply))
        if reply.finish_reason != "tool_calls":  # the call did not fit in max_new_tokens: answer next
            conv.messages.pop()
            show(f"         no complete call within {budget} tokens: {reply.content!r}")
            answer_now = True
            continue
        tool_call = reply.tool_calls[0]
        name, arguments = tool_call["function"]["name"], json.loads(tool_call["function"]["arguments"])
        call = {"name": name, "arguments": arguments}
        show(f"         {name}({json.dumps(arguments, ensure_ascii=False)})")
        if name == "final_answer":
            run.steps.append(Step(call, None, reply.stats))
            run.answer = arguments["answer"]
            break
        checker = jsonschema.Draft202012Validator(parameters[name], format_checker=jsonschema.FormatChecker())
        errors = [e.message for e in checker.iter_errors(arguments)]  # the grammar cannot check everything
        output: Any = {"error": "invalid arguments: " + "; ".join(errors)} if errors else functions[name](**arguments)
        answer_now = bool(run.steps) and run.steps[-1].call == call  # the same call again: time to answer
        run.steps.append(Step(call, output, reply.stats))
        show(f"         -> {json.dumps(output, ensure_ascii=False)}")
        conv.add_tool_result(tool_call["id"], json.dumps(output, ensure_ascii=False))
    run.messages = conv.messages[first:]
    return run


def quick_mode(argv_quick: bool) -> bool:
    """``--quick`` or ``GRAMMARSPEC_EXAMPLES_QUICK=1``: a short run for smoke tests."""
    return argv_quick or os.environ.get("GRAMMARSPEC_EXAMPLES_QUICK", "") not in ("", "0")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("questions", nargs="*", default=list(KNOWN_ANSWERS))
    parser.add_argument("--quick", action="store_true", help="one question, at most two steps, short calls")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--assistant", default="auto", help="proposer preset ('none' for plain decoding)")
    args = parser.parse_args(argv)
    quick = quick_mode(args.quick)
    model, tokenizer = grammarspec.load_model("smollm2-135m")
    assistant = None if args.assistant == "none" else args.assistant
    answered, replies = 0, []
    for question in args.questions[:1] if quick else args.questions:
        print(f"question: {question}")
        conv = new_conversation(model, tokenizer, assistant)
        run = run_agent(
            model,
            tokenizer,
            question,
            conversation=conv,
            max_steps=2 if quick else args.steps,
            max_new_tokens=64 if quick else 96,
            show=print,
        )
        print(f"answer: {run.answer}" if run.answer is not None else "no answer (see above)")
        right = is_right(question, run.answer)
        print(
            "every call was schema-valid (right tool and right answer are another matter): "
            + {True: "the answer is right", False: "the answer is WRONG", None: "answer not checked"}[right]
        )
        answered += run.answer is not None and right is not False
        replies += conv.replies
    reused, prefilled = sum(r.reused_tokens for r in replies), sum(r.prefilled_tokens for r in replies)
    tokens, forwards = sum(r.stats.new_tokens for r in replies), sum(r.stats.target_forwards for r in replies)
    print(
        f"{len(replies)} turns: prompt tokens {reused} reused, {prefilled} prefilled; "
        f"{tokens} generated tokens in {forwards} target passes; {sum(r.seconds for r in replies):.1f}s"
    )
    return 0 if answered == len(args.questions[:1] if quick else args.questions) else 1


if __name__ == "__main__":
    sys.exit(main())
