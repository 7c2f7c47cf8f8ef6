"""What the output must follow: the constraint arguments gathered in one value.

``generate``, ``complete`` and :class:`~grammarspec.Conversation` take the same
constraint keywords (``schema=``, ``tools=`` with ``tool_choice=`` and
``parallel_tool_calls=``, ``grammar=``, ``regex=``, ``json_object=``,
``any_whitespace=``).  Each builds one :class:`Constraint` from them and passes
that along; :meth:`Constraint.resolve` applies ``tool_choice`` once, and
:meth:`Constraint.specs` gives each row its :class:`~grammars.GrammarSpec`.

    >>> tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    >>> Constraint(tools=tools, tool_choice="none").resolve().specs(1)
    [None]
    >>> Constraint(tools=tools).resolve().specs(1)[0].kind          # tool_choice=None: "required"
    'json_schema'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grammars import GrammarError, GrammarSpec, grammar_spec

__all__ = ["Constraint"]

#: The fields that :meth:`Constraint.resolve` applies instead of passing them to :func:`grammars.grammar_spec`.
_NOT_GRAMMAR = ("tool_choice", "tool_format")


@dataclass(frozen=True)
class Constraint:
    """The user's constraint arguments for one call.  Frozen; methods return new values.

    ``tool_choice``: with ``tools``, ``"required"`` (one call; the default
    ``None`` means this for ``generate`` and ``complete``), ``"auto"`` (text or
    a call), ``"none"`` (the tools are not used) or ``{"type": "function",
    "function": {"name": ...}}``.  ``tool_format``: the call format
    (:mod:`grammarspec.tool_calls`); ``"json"`` outside a :class:`Conversation`.
    ``schema``: a list gives one schema per row.
    """

    schema: Any = None
    tools: Sequence[Mapping[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = False
    grammar: str | None = None
    regex: str | None = None
    json_object: bool = False
    any_whitespace: bool = False
    tool_format: str = "json"

    def __post_init__(self) -> None:
        # Checked here, where complete() and Conversation.reply() build it: resolve() drops
        # parallel_tool_calls, so generate's own check would never see a truthy "yes".
        for name in ("parallel_tool_calls", "json_object", "any_whitespace"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"{name}= must be True or False, got {value!r}")

    @classmethod
    def keywords(cls) -> tuple[str, ...]:
        """The constraint keywords ``generate``, ``complete`` and ``Conversation`` take (every field but the format)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "tool_format")

    @classmethod
    def among(cls, arguments: Mapping[str, Any]) -> Constraint:
        """The constraint that ``arguments`` (a function's arguments by name, its ``locals()`` on entry) name:
        its :meth:`keywords`, picked out, so ``generate`` and ``complete`` do not each list them again."""
        return cls(**{name: arguments[name] for name in cls.keywords()})

    def _grammar_arguments(self) -> dict[str, Any]:
        """The fields :func:`grammars.grammar_spec` takes, by name (every field but the tool choice and format)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _NOT_GRAMMAR}

    @property
    def others(self) -> list[str]:
        """The constraint arguments other than ``tools`` that are set."""
        given = (
            ("schema", self.schema),
            ("grammar", self.grammar),
            ("regex", self.regex),
            ("json_object", self.json_object or None),
        )
        return [name for name, value in given if value is not None]

    def resolve(self) -> Constraint:
        """The constraint with ``tool_choice`` applied: tools as a call schema, as a grammar, or dropped.  Pure.

        Raises :class:`~grammars.GrammarError` when ``tools`` and another
        constraint would both shape the output.
        """
        from grammarspec.tool_calls import ToolCallError, tool_constraint

        if self.tools is None:
            if self.tool_choice not in (None, "none", "auto"):
                raise ToolCallError(
                    f"tool_choice={self.tool_choice!r} needs tools: pass tools=[...], or drop tool_choice="
                )
            return dataclasses.replace(self, tool_choice=None)
        choice = "required" if self.tool_choice is None else self.tool_choice
        if choice == "none":
            return dataclasses.replace(self, tools=None, tool_choice=None, parallel_tool_calls=False)
        if self.others:
            raise GrammarError(
                f"tools= with tool_choice={choice!r} makes the output a tool call, so {', '.join(self.others)}= "
                "cannot shape it too; pass tool_choice='none' to constrain this output with "
                f"{self.others[0]}= instead, or drop {self.others[0]}="
            )
        kwargs = tool_constraint(self.tools, choice, self.parallel_tool_calls, self.tool_format, self.any_whitespace)
        base = dataclasses.replace(self, tools=None, tool_choice=None, parallel_tool_calls=False)
        return dataclasses.replace(base, **kwargs)

    def specs(self, batch: int) -> list[GrammarSpec | None]:
        """One :class:`GrammarSpec` per row (``None``: unconstrained), for a resolved constraint.  Pure."""
        if isinstance(self.schema, list):
            if len(self.schema) != batch:
                raise GrammarError(
                    f"schema= got list of {len(self.schema)} schemas for a batch of {batch} rows: pass one "
                    "schema per row, or a single schema (dict, JSON string or pydantic model) for every row"
                )
            schemas = list(self.schema)
        else:
            schemas = [self.schema] * batch
        built: dict[int, GrammarSpec | None] = {}
        out = []
        for schema in schemas:
            if id(schema) not in built:
                built[id(schema)] = grammar_spec(**{**self._grammar_arguments(), "schema": schema})
            out.append(built[id(schema)])
        return out
