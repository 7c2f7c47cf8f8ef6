"""ECMA-262 Unicode property escapes (``\\p{Lu}``, ``\\P{Script=Greek}``) for engines that do not read them.

JSON Schema's ``pattern`` is an ECMA-262 regex, and ECMA-262 (with the
Unicode flag) matches characters by Unicode property with ``\\p{...}`` and
``\\P{...}``.  Python's ``re`` (used by ``jsonschema``) and xgrammar's regex
compiler do not read these escapes; llguidance and outlines-core (Rust's
``regex-syntax``) do.  This module

* checks that each escape names a property ECMA-262 defines
  (:func:`property_problem`): a General_Category value (``L``, ``Lu``,
  ``Uppercase_Letter``, ...), ``General_Category=``/``gc=``,
  ``Script=``/``sc=``, ``Script_Extensions=``/``scx=`` with a value, or one
  of ECMA-262's binary properties (``Alphabetic``, ``White_Space``, ...);
* rewrites a pattern so that each escape becomes the explicit character
  class of the code points that have the property (:func:`expand`):
  exactly the same set, in the Unicode version of the ``regex`` module that
  computes it.  The validator (:mod:`grammars.validation`) and xgrammar both
  read the rewritten form, so what the grammar allows and what the
  validator accepts are the same characters.

    >>> expand(r"^\\p{Lu}$", dialect="python")[:14]
    '^[A-Z\\\\xc0-\\\\xd6'
    >>> property_problem("Lu") is None, property_problem("Script=Greek") is None
    (True, True)
    >>> property_problem("lu")[:55]
    "'lu' is not a Unicode property ECMA-262 defines (names "
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from typing import Any, Literal

__all__ = [
    "has_property_escapes",
    "property_escapes",
    "property_problem",
    "expand",
    "python_pattern",
    "python_schema",
    "regex_format_checker",
    "is_ecma_regex",
]

Dialect = Literal["python", "xgrammar"]

#: General_Category values and their aliases (ECMA-262, table "Value aliases and canonical values for the
#: Unicode property General_Category").
GENERAL_CATEGORIES = frozenset(
    "C Other Cc Control cntrl Cf Format Cn Unassigned Co Private_Use Cs Surrogate L Letter LC Cased_Letter "
    "Ll Lowercase_Letter Lm Modifier_Letter Lo Other_Letter Lt Titlecase_Letter Lu Uppercase_Letter M Mark "
    "Combining_Mark Mc Spacing_Mark Me Enclosing_Mark Mn Nonspacing_Mark N Number Nd Decimal_Number digit Nl "
    "Letter_Number No Other_Number P Punctuation punct Pc Connector_Punctuation Pd Dash_Punctuation Pe "
    "Close_Punctuation Pf Final_Punctuation Pi Initial_Punctuation Po Other_Punctuation Ps Open_Punctuation "
    "S Symbol Sc Currency_Symbol Sk Modifier_Symbol Sm Math_Symbol So Other_Symbol Z Separator Zl "
    "Line_Separator Zp Paragraph_Separator Zs Space_Separator".split()
)

#: ECMA-262's binary Unicode properties and their aliases (table "Binary Unicode property aliases").
BINARY_PROPERTIES = frozenset(
    "ASCII ASCII_Hex_Digit AHex Alphabetic Alpha Any Assigned Bidi_Control Bidi_C Bidi_Mirrored Bidi_M "
    "Case_Ignorable CI Cased Changes_When_Casefolded CWCF Changes_When_Casemapped CWCM Changes_When_Lowercased "
    "CWL Changes_When_NFKC_Casefolded CWKCF Changes_When_Titlecased CWT Changes_When_Uppercased CWU Dash "
    "Default_Ignorable_Code_Point DI Deprecated Dep Diacritic Dia Emoji Emoji_Component EComp Emoji_Modifier "
    "EMod Emoji_Modifier_Base EBase Emoji_Presentation EPres Extended_Pictographic ExtPict Extender Ext "
    "Grapheme_Base Gr_Base Grapheme_Extend Gr_Ext Hex_Digit Hex IDS_Binary_Operator IDSB IDS_Trinary_Operator "
    "IDST ID_Continue IDC ID_Start IDS Ideographic Ideo Join_Control Join_C Logical_Order_Exception LOE "
    "Lowercase Lower Math Noncharacter_Code_Point NChar Pattern_Syntax Pat_Syn Pattern_White_Space Pat_WS "
    "Quotation_Mark QMark Radical Regional_Indicator RI Sentence_Terminal STerm Soft_Dotted SD "
    "Terminal_Punctuation Term Unified_Ideograph UIdeo Uppercase Upper Variation_Selector VS White_Space space "
    "XID_Continue XIDC XID_Start XIDS".split()
)

_NAMED = {"General_Category": "gc", "gc": "gc", "Script": "sc", "sc": "sc", "Script_Extensions": "scx", "scx": "scx"}

#: A property escape: ``\p{...}`` or ``\P{...}`` (group 1: p or P, group 2: the name).
_ESCAPE = re.compile(r"\\([pP])\{([^}]*)\}")


def _scan(pattern: str) -> Iterator[tuple[int, int, str, str, bool, bool]]:
    """Each property escape as ``(start, end, p or P, name, inside a class, the class is negated)``.

    Walks ECMA-262 syntax: ``\\x`` escapes one character, ``[...]`` is a class
    (``[`` inside it is literal, ``]`` first in it is not special in ECMA-262
    either: ``[]`` is the empty class).
    """
    i, n = 0, len(pattern)
    in_class, negated = False, False
    while i < n:
        char = pattern[i]
        if char == "\\":
            match = _ESCAPE.match(pattern, i)
            if match:
                yield match.start(), match.end(), match.group(1), match.group(2), in_class, negated
                i = match.end()
                continue
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
            negated = pattern.startswith("^", i + 1)
        elif char == "]" and in_class:
            in_class = False
        i += 1


def property_escapes(pattern: str) -> list[str]:
    """The property escapes in ``pattern``, as written (``['\\\\p{Lu}']``).  Pure."""
    return [pattern[start:end] for start, end, *_ in _scan(pattern)]


def has_property_escapes(pattern: str) -> bool:
    """Whether ``pattern`` has a ``\\p{...}``/``\\P{...}`` escape.  Pure."""
    return ("\\p{" in pattern or "\\P{" in pattern) and bool(property_escapes(pattern))


def property_problem(name: str) -> str | None:
    """Why ``\\p{name}`` is not an ECMA-262 property escape grammarspec can check, else ``None``.  Pure."""
    key, sep, value = name.partition("=")
    if sep:
        if key not in _NAMED:
            return (
                f"{name!r} is not a Unicode property ECMA-262 defines (before '=' it allows General_Category, gc, "
                "Script, sc, Script_Extensions or scx)"
            )
        if _NAMED[key] == "gc":
            if value not in GENERAL_CATEGORIES:
                return f"{value!r} is not a General_Category value ECMA-262 defines (such as Lu or Letter)"
            return None
        if not re.fullmatch(r"[A-Za-z][A-Za-z_]*", value) or _compiles(f"{_NAMED[key]}={value}") is None:
            return f"{value!r} is not a Unicode script name (such as Latin, Greek or Cyrillic)"
        return None
    if name in GENERAL_CATEGORIES or name in BINARY_PROPERTIES:
        return None if _compiles(name) is not None else f"grammarspec's Unicode tables (the regex module) lack {name!r}"
    return (
        f"{name!r} is not a Unicode property ECMA-262 defines (names are case-sensitive: General_Category values "
        "such as Lu or Letter, Script=..., Script_Extensions=..., or a binary property such as Alphabetic)"
    )


@functools.cache
def _compiles(name: str) -> Any:
    import regex

    try:
        return regex.compile(r"\p{" + name + "}+")
    except regex.error:
        return None


@functools.lru_cache(maxsize=1)
def _every_code_point() -> str:
    return "".join(map(chr, range(0x110000)))


@functools.lru_cache(maxsize=256)
def _ranges(name: str, negated: bool) -> tuple[tuple[int, int], ...]:
    """The code point ranges (inclusive) with property ``name`` (without it, when ``negated``).  Cached."""
    compiled = _compiles(name)
    if compiled is None:  # property_problem said why; callers check first
        raise ValueError(f"unknown Unicode property {name!r}")
    runs = [(m.start(), m.end() - 1) for m in compiled.finditer(_every_code_point())]
    if not negated:
        return tuple(runs)
    gaps, low = [], 0
    for start, end in runs:
        if start > low:
            gaps.append((low, start - 1))
        low = end + 1
    if low <= 0x10FFFF:
        gaps.append((low, 0x10FFFF))
    return tuple(gaps)


def _char(code: int, dialect: Dialect) -> str:
    if dialect == "python":
        if code < 0x80 and (chr(code).isalnum() or chr(code) == "_"):
            return chr(code)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    char = chr(code)  # xgrammar: the character itself (UTF-8), escaped where a class gives it a meaning
    if char in "\\]-^[" or code < 0x20 or code == 0x7F:
        return f"\\u{code:04x}"
    return char


def _members(name: str, negated: bool, dialect: Dialect) -> str:
    """The body of a character class (no brackets) with exactly the code points of ``\\p{name}`` (``\\P`` if negated).

    xgrammar reads UTF-8 text, where no surrogate code point can occur: they are left out of its form.
    """
    parts = []
    for start, end in _ranges(name, negated):
        if dialect == "xgrammar":
            if start <= 0xDFFF and end >= 0xD800:  # cut out the surrogates
                if start < 0xD800:
                    parts.append(_span(start, 0xD7FF, dialect))
                if end > 0xDFFF:
                    parts.append(_span(0xE000, end, dialect))
                continue
        parts.append(_span(start, end, dialect))
    return "".join(parts)


def _span(start: int, end: int, dialect: Dialect) -> str:
    if start == end:
        return _char(start, dialect)
    return f"{_char(start, dialect)}-{_char(end, dialect)}"


def expand(pattern: str, *, dialect: Dialect) -> str:
    """``pattern`` with each property escape replaced by the explicit class of its code points.  Pure.

    Outside a class, ``\\p{X}`` becomes ``[...]`` and ``\\P{X}`` the class of
    every other code point; inside one, the members are spliced in (inside a
    negated class too: ``[^\\p{L}x]`` stays "neither a letter nor x").
    Raises ``ValueError`` naming an escape :func:`property_problem` refuses.
    """
    out, last = [], 0
    for start, end, kind, name, in_class, _ in _scan(pattern):
        problem = property_problem(name)
        if problem is not None:
            raise ValueError(f"\\{kind}{{{name}}}: {problem}")
        members = _members(name, kind == "P", dialect)
        out.append(pattern[last:start])
        out.append(members if in_class else f"[{members}]")
        last = end
    out.append(pattern[last:])
    return "".join(out)


def python_pattern(pattern: str) -> str:
    """``pattern`` as Python's ``re`` reads it (property escapes expanded; unchanged without any).  Pure."""
    return expand(pattern, dialect="python") if has_property_escapes(pattern) else pattern


def python_schema(schema: Any) -> tuple[Any, dict[str, str]]:
    """``(schema, originals)``: ``schema`` with every ``pattern`` and ``patternProperties`` key in Python's dialect
    (a copy when changed, else the same object), and each rewritten pattern's original text by its new one.  Pure.
    """
    return _rewritten(schema, "python")


def xgrammar_schema(schema: Any) -> Any:
    """``schema`` with its property escapes in the form xgrammar reads (a copy when changed; else the same).  Pure."""
    return _rewritten(schema, "xgrammar")[0]


def _rewritten(schema: Any, dialect: Dialect) -> tuple[Any, dict[str, str]]:
    from .schema_walk import schema_nodes

    originals: dict[str, str] = {}
    if not any(_node_escapes(node) for node in schema_nodes(schema)):
        return schema, originals
    schema = copy.deepcopy(schema)
    for node in schema_nodes(schema):
        _rewrite_node(node, dialect, originals)
    return schema, originals


def _node_escapes(node: dict[str, Any]) -> bool:
    pattern = node.get("pattern")
    keys = node.get("patternProperties")
    return (isinstance(pattern, str) and has_property_escapes(pattern)) or (
        isinstance(keys, dict) and any(isinstance(k, str) and has_property_escapes(k) for k in keys)
    )


def _rewrite_node(node: dict[str, Any], dialect: Dialect, originals: dict[str, str]) -> None:
    def rewrite(pattern: str) -> str:
        if not has_property_escapes(pattern):
            return pattern
        expanded = expand(pattern, dialect=dialect)
        originals[expanded] = pattern
        return expanded

    pattern = node.get("pattern")
    if isinstance(pattern, str):
        node["pattern"] = rewrite(pattern)
    keys = node.get("patternProperties")
    if isinstance(keys, dict):
        node["patternProperties"] = {rewrite(k) if isinstance(k, str) else k: v for k, v in keys.items()}


def is_ecma_regex(pattern: str) -> bool:
    """Whether ``pattern`` reads as a regex: Python's ``re`` after the property escapes are expanded.  Pure.

    Python's ``re`` stands in for ECMA-262 as ``jsonschema`` has it do; the
    property escapes it lacks are checked here against ECMA-262's names.
    """
    try:
        re.compile(python_pattern(pattern))
    except (re.error, ValueError):
        return False
    return True


def regex_format_checker(base: Any) -> Any:
    """A copy of the ``jsonschema`` format checker ``base`` whose ``regex`` format reads property escapes.  Pure."""
    from jsonschema import FormatChecker

    checker = FormatChecker(formats=())
    checker.checkers = dict(base.checkers)
    if "regex" in checker.checkers:
        checker.checkers["regex"] = (_check_regex, (re.error, ValueError))
    return checker


def _check_regex(instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    re.compile(python_pattern(instance))  # raises re.error / ValueError (a property ECMA-262 lacks): not a regex
    return True
