"""A tool-calling agent on the embedded model.

The model sees OpenAI-style tool definitions (weather, calculator, calendar,
and ``final_answer``) and, under ``tools=``, writes one call at a time:
``{"name": ..., "arguments": {...}}`` -- the grammar guarantees a known tool
and arguments that follow its JSON Schema.  The Python function runs, its
result goes back into the conversation as a ``tool`` message, and the loop
continues until the model calls ``final_answer``.  On the last allowed step
(or after the model repeats a call) only ``final_answer`` is offered, and its
answer is at most 160 characters, so the loop always ends with an answer.

    .venv/bin/python examples/tool_agent.py "What is 17 * 23? And how warm is it in Oslo?"
    .venv/bin/python examples/tool_agent.py --quick         # two steps at most (CI smoke test)

SmolLM2-135M is a very small model: expect valid calls, not always wise ones.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import operator
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

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
                    "city": {"type": "string", "description": "City name, e.g. Oslo"},
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
                "properties": {"expression": {"type": "string", "description": "e.g. (17 * 23) + 4"}},
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
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.Pow: operator.pow, ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos,
}  # fmt: skip


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
    messages: list[dict[str, str]] = field(default_factory=list)


def run_agent(
    model: Any,
    tokenizer: Any,
    question: str,
    *,
    max_steps: int = 6,
    max_new_tokens: int = 96,
    assistant: Any = "auto",
    show: Callable[[str], None] = lambda text: None,
) -> AgentRun:
    """Ask, call tools until ``final_answer`` (forced on the last step), and return the transcript."""
    calendar = Calendar()
    functions: dict[str, Callable[..., Any]] = {
        "get_weather": get_weather,
        "calculator": calculator,
        "add_event": calendar.add_event,
        "list_events": calendar.list_events,
    }
    run = AgentRun(question, messages=[{"role": "user", "content": question}])
    answer_now = False
    for step in range(max_steps):
        answer_now = answer_now or step == max_steps - 1
        tools = [t for t in TOOLS if t["function"]["name"] == "final_answer"] if answer_now else TOOLS
        # A final answer is at most 160 characters, so its call always fits in the budget below.
        budget = max(max_new_tokens, 192) if answer_now else max_new_tokens
        result = grammarspec.complete(
            model, tokenizer, run.messages, system=SYSTEM, tools=tools, assistant=assistant, max_new_tokens=budget
        )
        if result.finish_reason != "stop":  # the call did not fit in max_new_tokens: answer next
            show(f"[step {step + 1}] no complete call within {budget} tokens: {result.text!r}")
            answer_now = True
            continue
        call = result.value
        run.messages.append({"role": "assistant", "content": result.text})
        name, arguments = call["name"], call["arguments"]
        show(f"[step {step + 1}] {name}({json.dumps(arguments, ensure_ascii=False)})"
             f"   -- {result.stats.new_tokens} tokens in {result.stats.target_forwards} forward passes")  # fmt: skip
        if name == "final_answer":
            run.steps.append(Step(call, None, result.stats))
            run.answer = arguments["answer"]
            break
        if result.errors:  # the grammar cannot check everything (e.g. that a date exists)
            output: Any = {"error": "invalid arguments: " + "; ".join(result.errors)}
        else:
            output = functions[name](**arguments)
        answer_now = bool(run.steps) and run.steps[-1].call == call  # the same call again: time to answer
        run.steps.append(Step(call, output, result.stats))
        show(f"           -> {json.dumps(output, ensure_ascii=False)}")
        run.messages.append({"role": "tool", "content": json.dumps(output, ensure_ascii=False)})
    return run


def quick_mode(argv_quick: bool) -> bool:
    """``--quick`` or ``GRAMMARSPEC_EXAMPLES_QUICK=1``: a short run for smoke tests."""
    return argv_quick or os.environ.get("GRAMMARSPEC_EXAMPLES_QUICK", "") not in ("", "0")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("question", nargs="?", default="What is 17 * 23? And how warm is it in Oslo, in celsius?")
    parser.add_argument("--quick", action="store_true", help="at most two steps, short calls")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--assistant", default="auto", help="proposer preset ('none' for plain decoding)")
    args = parser.parse_args(argv)
    quick = quick_mode(args.quick)
    model, tokenizer = grammarspec.load_model("smollm2-135m")
    print(f"question: {args.question}")
    run = run_agent(
        model, tokenizer, args.question, max_steps=2 if quick else args.steps, max_new_tokens=64 if quick else 96,
        assistant=None if args.assistant == "none" else args.assistant, show=print,
    )  # fmt: skip
    print(f"answer: {run.answer}" if run.answer is not None else "no answer (see above)")
    tokens = sum(s.stats.new_tokens for s in run.steps)
    forwards = sum(s.stats.target_forwards for s in run.steps)
    print(f"{len(run.steps)} steps, {tokens} generated tokens in {forwards} target forward passes")
    return 0 if run.answer is not None else 1


if __name__ == "__main__":
    sys.exit(main())
