"""The features a backend's capability table covers, and :class:`Capabilities`, what each backend declares.

A leaf: each backend module declares its ``capabilities`` with
:meth:`Capabilities.declare`, and :mod:`grammars.capabilities` answers per
schema, through :mod:`grammars.registry`, what a backend enforces.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["Support", "Capabilities", "CORE", "FEATURES"]

Support = Literal["enforced", "ignored", "refused"]

#: Features with a setting of their own (the plain keyword names cover the rest).
FEATURES = (
    "pattern:lookaround",  # a pattern with (?=...), (?!...), (?<=...), (?<!...)
    "maxLength+pattern",
    "minLength+pattern",  # length bounds on a string that has a pattern
    "multipleOf:number",  # multipleOf on a "number" (not "integer")
    "allOf:multi",  # allOf with two or more parts
    "oneOf:overlap",  # oneOf whose branches both match one value ("exactly one" is not checked)
    "$ref+siblings",  # keywords beside a $ref
    "anyOf+siblings",  # keywords beside anyOf / oneOf / allOf (xgrammar drops them)
    "enum+siblings",  # keywords beside enum / const (xgrammar drops them)
)

_E: Support = "enforced"
_I: Support = "ignored"
_R: Support = "refused"

#: The keywords every backend enforces: the start of each backend's table.
CORE: Mapping[str, Support] = {
    "type": _E,
    "enum": _E,
    "const": _E,
    "required": _E,
    "additionalProperties": _E,
    "items": _E,
    "prefixItems": _E,
    "minItems": _E,
    "maxItems": _E,
    "minLength": _E,
    "maxLength": _E,
    "pattern": _E,
    "anyOf": _E,
    "oneOf": _E,
    "$ref": _E,
}


@dataclass(frozen=True)
class Capabilities:
    """What one backend compiles and enforces: declared in its module, checked by :data:`PROBES`."""

    #: The grammar kinds it compiles (:attr:`grammars.spec.GrammarSpec.kind`).
    kinds: frozenset[str]
    #: ``table[feature]`` for each JSON-Schema feature; a feature not listed is ``"ignored"``.
    table: Mapping[str, Support]
    #: The ``format`` values it turns into a grammar.
    formats: frozenset[str]
    #: What it does with a ``format`` it has no grammar for.
    other_formats: Support
    #: ``backend="auto"`` tries backends in increasing rank (:mod:`grammars.select`).
    auto_rank: int

    @classmethod
    def declare(
        cls,
        *,
        kinds: str,
        formats: str,
        other_formats: Support,
        auto_rank: int,
        enforced: str = "",
        ignored: str = "",
        refused: str = "",
    ) -> Capabilities:
        """Capabilities from space-separated names: the table is :data:`CORE` plus the features listed.  Pure."""
        table: dict[str, Support] = dict(CORE)
        for support, names in ((_E, enforced), (_I, ignored), (_R, refused)):
            table.update(dict.fromkeys(names.split(), support))
        return cls(frozenset(kinds.split()), table, frozenset(formats.split()), other_formats, auto_rank)
