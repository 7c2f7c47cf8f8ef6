"""The agent benchmark's conversations and the Python tools behind them (all made up).

Every conversation is a script: a user message (a string), or a model turn
(:class:`ModelTurn`: the ``tool_choice`` and token budget for that turn).  The
model's tool calls run the real Python functions below and their results go
back into the conversation as ``tool`` messages, so what the model sees next
depends on what it called -- in every arm alike.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["CONVERSATIONS", "SYSTEM", "TOOLS", "ModelTurn", "run_tool"]

SYSTEM = "You are a helpful shop assistant. Use the tools to look things up, then answer in one short sentence."


#: String arguments are bounded so that a call always ends within a turn's budget (the model can loop).


def _function(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(properties)},
        },
    }


TOOLS: list[dict[str, Any]] = [
    _function(
        "get_weather",
        "Current weather for a city.",
        {"city": {"type": "string", "maxLength": 24}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    ),
    _function(
        "calculator",
        "Evaluate an arithmetic expression with + - * / and parentheses.",
        {"expression": {"type": "string", "maxLength": 40}},
    ),
    _function(
        "lookup_order", "Status of an order by its id, e.g. A-1042.", {"order_id": {"type": "string", "maxLength": 12}}
    ),
    _function(
        "find_product", "Price and stock of a product in the shop.", {"name": {"type": "string", "maxLength": 32}}
    ),
]

_WEATHER = {"oslo": (4.0, "light rain"), "paris": (14.5, "sunny"), "lima": (21.0, "fog"), "tokyo": (18.0, "cloudy")}
_ORDERS: dict[str, dict[str, Any]] = {
    "A-1042": {"status": "shipped", "carrier": "PostNord", "eta": "2025-06-04", "items": ["desk lamp", "bulbs"]},
    "A-1043": {"status": "processing", "carrier": None, "eta": "2025-06-09", "items": ["office chair"]},
    "B-2001": {"status": "delivered", "carrier": "DHL", "eta": "2025-05-28", "items": ["monitor arm"]},
}
_PRODUCTS: dict[str, dict[str, Any]] = {
    "desk lamp": {"price": 39.9, "currency": "EUR", "in_stock": 12},
    "office chair": {"price": 189.0, "currency": "EUR", "in_stock": 0, "restock": "2025-06-15"},
    "monitor arm": {"price": 74.5, "currency": "EUR", "in_stock": 5},
}
_OPERATORS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _calculate(expression: str) -> dict[str, Any]:
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ( )")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as e:
        return {"expression": expression, "error": str(e) or type(e).__name__}
    return {"expression": expression, "result": round(result, 4)}


def run_tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The Python function behind a tool call (a JSON-able result; unknown input gives an error field)."""
    if name == "get_weather":
        known = _WEATHER.get(str(arguments.get("city", "")).strip().lower())
        if known is None:
            return {"error": f"no weather for {arguments.get('city')!r}"}
        celsius = known[0] if arguments.get("unit") != "fahrenheit" else round(known[0] * 9 / 5 + 32, 1)
        return {
            "city": arguments["city"],
            "temperature": celsius,
            "unit": arguments.get("unit"),
            "conditions": known[1],
        }
    if name == "calculator":
        return _calculate(str(arguments.get("expression", "")))
    if name == "lookup_order":
        order = _ORDERS.get(str(arguments.get("order_id", "")).strip().upper())
        return {"order_id": arguments.get("order_id"), **order} if order else {"error": "no such order"}
    if name == "find_product":
        product = _PRODUCTS.get(str(arguments.get("name", "")).strip().lower())
        return {"name": arguments.get("name"), **product} if product else {"error": "no such product"}
    return {"error": f"unknown tool {name!r}"}


@dataclass(frozen=True)
class ModelTurn:
    """One assistant turn of a script."""

    tool_choice: Any = "auto"
    max_new_tokens: int = 64


CALL, ANSWER = ModelTurn("required", 64), ModelTurn("none", 40)

#: name -> script.  Each has at least four model turns with tool results fed back.
CONVERSATIONS: dict[str, list[Any]] = {
    "weather": [
        "What is the weather in Oslo, in celsius?",
        CALL,
        ANSWER,
        "And in Lima, in fahrenheit?",
        CALL,
        ModelTurn("auto", 40),
    ],
    "orders": [
        "Where is my order A-1042?",
        CALL,
        ANSWER,
        "What about order A-1043?",
        ModelTurn({"type": "function", "function": {"name": "lookup_order"}}),
        ANSWER,
    ],
    "shopping": [
        "How much is the desk lamp?",
        CALL,
        ANSWER,
        "I want 3 of them. What is the total?",
        ModelTurn({"type": "function", "function": {"name": "calculator"}}),
        ANSWER,
        "Is the office chair in stock?",
        CALL,
        ANSWER,
    ],
    "mixed": [
        "Is the monitor arm in stock?",
        CALL,
        ANSWER,
        "What is 74.5 * 2 + 39.9?",
        CALL,
        ModelTurn("auto", 40),
    ],
}
