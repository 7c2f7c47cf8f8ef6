"""Grammars that no finite text satisfies, and grammars whose forced text may run away.

A schema such as ``{"type": "object", "properties": {"x": {"$ref": "#"}},
"required": ["x"]}`` has no finite value: every ``x`` needs another ``x``.
Decoding under it never ends well -- the output stops at the token limit,
llguidance fails mid-generation, and xgrammar's forced-text search
(``find_jump_forward_string``) grows without bound.  The same holds for a
part of a grammar (one branch of an ``anyOf``): once the output enters it,
nothing can complete it.  :func:`check_finite` refuses such a grammar up
front, in milliseconds, with a :class:`GrammarError` that says which rules
never end.

The analysis reads xgrammar's normalised EBNF of the grammar (rules of
literals, character classes, rule references, groups, alternatives and
``* + ? {m,n}`` repetitions): a rule is *productive* when some alternative
derives a finite string; the rules reachable from ``root`` must all be.
When every reachable rule is productive, every prefix the parser accepts
can be completed, so the forced text after it is no longer than the
shortest completion.

:func:`forced_text_bounded` finds grammars whose forced text stays finite
yet costly for xgrammar: an open-ended repetition with a large lower bound
(``minItems: 3000`` without ``maxItems`` forces ``[a,a,...`` and the search
takes seconds, more than a gigabyte at 100,000), or any rule whose shortest
text is long.  Jump-forward is drafting only, so such a grammar simply gets
no forced text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

from .base import GrammarError
from .spec import GrammarSpec

__all__ = [
    "check_finite",
    "forced_text_bounded",
    "Language",
    "analyse",
    "xgrammar_ebnf",
    "LARGE_REPEAT",
    "LONG_SHORTEST",
]

#: A rule whose shortest text is longer than this forces long text once entered.  xgrammar's compiled grammar
#: writes an open repetition out as a chain of rules, so there the long shortest text is what shows it (the
#: sample corpus's longest is 319 characters).
LONG_SHORTEST = 512
#: From this lower bound an open-ended repetition makes xgrammar's forced-text search slow
#: (measured on xgrammar 0.2.9: 300 -> 0.03 s, 1,000 -> 0.36 s, 3,000 -> 3.8 s; 100,000 -> out of memory).
LARGE_REPEAT = 128

# An element: ("lit", length) | ("ref", name) | ("alt", [sequence, ...]) | ("rep", element, low, high); high -1 = open.
_Element = tuple


@dataclass(frozen=True)
class Language:
    """What :func:`analyse` found: the shortest string of each productive rule, and the unproductive reachable ones."""

    shortest: dict[str, int]
    never_ends: tuple[str, ...]
    open_repeat: int  # the largest lower bound of an open-ended repetition reachable from root

    @property
    def empty(self) -> bool:
        return "root" in self.never_ends


_STR = r'"(?:[^"\\]|\\.)*"'
_CLS = r"\[(?:[^\]\\]|\\.)*\]"
#: xgrammar's ``Regex("...", json_string=true)`` element (a pattern it compiles itself)
_REGEX = r"Regex\(" + _STR + r"(?:\s*,\s*\w+\s*=\s*\w+)*\)"
_TOKEN = re.compile(
    rf"\s*(?:(?P<regex>{_REGEX})|(?P<str>{_STR})|(?P<cls>{_CLS})|(?P<look>\(=)|(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)"
    r"|(?P<rep>\{\s*\d+\s*(?:,\s*-?\d*\s*)?\})|(?P<op>[()|*+?]))"
)


_END = re.compile(r"\s*\Z")


def _tokens(body: str) -> Iterator[tuple[str, str]]:
    pos = 0
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if m is None:
            if _END.match(body, pos):
                return
            raise ValueError(f"unexpected text {body[pos : pos + 20]!r}")
        kind = m.lastgroup
        assert kind is not None
        yield kind, m.group(kind)
        pos = m.end()


def _literal_length(text: str) -> int:
    inner = text[1:-1]
    return len(re.sub(r"\\(?:x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.)", "_", inner))


class _Parser:
    def __init__(self, body: str) -> None:
        self.items = list(_tokens(body))
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.items[self.i] if self.i < len(self.items) else None

    def alternatives(self) -> _Element:
        alts = [self.sequence()]
        while self.peek() == ("op", "|"):
            self.i += 1
            alts.append(self.sequence())
        return ("alt", alts)

    def sequence(self) -> list[_Element]:
        seq: list[_Element] = []
        while True:
            item = self.peek()
            if item is None or item in (("op", "|"), ("op", ")")):
                return seq
            self.i += 1
            kind, text = item
            if kind == "look":  # a lookahead constrains what follows, it derives nothing
                self.alternatives()
                self._close()
                continue
            if kind == "str":
                element: _Element = ("lit", _literal_length(text))
            elif kind == "cls":
                element = ("lit", 1)
            elif kind == "regex":  # productive unless its pattern is empty, which xgrammar refuses itself
                element = ("lit", 0)
            elif kind == "name":
                element = ("ref", text)
            elif item == ("op", "("):
                element = self.alternatives()
                self._close()
            else:
                raise ValueError(f"unexpected {text!r}")
            seq.append(self._repeat(element))

    def _close(self) -> None:
        if self.peek() != ("op", ")"):
            raise ValueError("unbalanced parenthesis")
        self.i += 1

    def _repeat(self, element: _Element) -> _Element:
        while True:
            item = self.peek()
            if item is None:
                return element
            kind, text = item
            if kind == "rep":
                self.i += 1
                parts = text.strip("{} ").split(",")
                low = int(parts[0])
                high = low if len(parts) == 1 else int(parts[1]) if parts[1].strip() not in ("", "-1") else -1
                element = ("rep", element, low, high)
            elif item in (("op", "*"), ("op", "+"), ("op", "?")):
                self.i += 1
                element = ("rep", element, 1 if text == "+" else 0, 1 if text == "?" else -1)
            else:
                return element


_LITERALS = re.compile(f"{_STR}|{_CLS}")
_NAME = re.compile(r"[A-Za-z_]")
_OPEN = re.compile(r"\{\s*(\d+)\s*,\s*(?:-1)?\s*\}|\*|\+")


def _parse(ebnf: str) -> dict[str, _Element]:
    rules: dict[str, _Element] = {}
    for line in ebnf.splitlines():
        if not line.strip():
            continue
        name, sep, body = line.partition(" ::= ")
        if not sep:
            raise ValueError(f"not a rule: {line[:40]!r}")
        bare = _LITERALS.sub('""', body)
        if bare.count('""') > 256 and not _NAME.search(bare):  # many literals only (an enum): productive, not parsed
            low = max((int(m.group(1) or 0) for m in _OPEN.finditer(bare)), default=0)
            rules[name.strip()] = ("alt", [[("lit", 0)], [("rep", ("lit", 0), low, -1)]])
            continue
        parser = _Parser(body)
        rules[name.strip()] = parser.alternatives()
        if parser.peek() is not None:
            raise ValueError(f"unparsed text in rule {name!r}")
    return rules


def _refs(element: _Element) -> Iterator[str]:
    kind = element[0]
    if kind == "ref":
        yield element[1]
    elif kind == "alt":
        for seq in element[1]:
            for e in seq:
                yield from _refs(e)
    elif kind == "rep":
        yield from _refs(element[1])


def _open_repeats(element: _Element) -> Iterator[int]:
    kind = element[0]
    if kind == "rep":
        if element[3] == -1:
            yield element[2]
        yield from _open_repeats(element[1])
    elif kind == "alt":
        for seq in element[1]:
            for e in seq:
                yield from _open_repeats(e)


def analyse(ebnf: str) -> Language:
    """The shortest string of each rule reachable from ``root`` and the ones that derive none.  Pure.

    Raises ``ValueError`` for text that is not xgrammar's normalised EBNF.
    """
    rules = _parse(ebnf)
    reachable, todo = set(), ["root"]
    while todo:
        name = todo.pop()
        if name in reachable or name not in rules:
            continue
        reachable.add(name)
        todo.extend(_refs(rules[name]))
    shortest: dict[str, int] = {}

    def length(element: _Element) -> int | None:
        kind = element[0]
        if kind == "lit":
            return int(element[1])
        if kind == "ref":
            return shortest.get(element[1])
        if kind == "rep":
            if element[2] == 0:
                return 0
            inner = length(element[1])
            return None if inner is None else inner * element[2]
        best: int | None = None
        for seq in element[1]:
            total: int | None = 0
            for e in seq:
                n = length(e)
                if n is None:
                    total = None
                    break
                total = (total or 0) + n
            if total is not None and (best is None or total < best):
                best = total
        return best

    order = [n for n in rules if n in reachable]
    for _ in range(len(order) + 1):  # a shortest derivation repeats no rule on a path: len(order) passes suffice
        changed = False
        for name in reversed(order):
            n = length(rules[name])
            if n is not None and (name not in shortest or n < shortest[name]):
                shortest[name] = n
                changed = True
        if not changed:
            break
    never = tuple(n for n in order if n not in shortest)
    open_repeat = max((low for n in order for low in _open_repeats(rules[n])), default=0)
    return Language(shortest, never, open_repeat)


def xgrammar_ebnf(spec: GrammarSpec) -> str | None:
    """xgrammar's normalised EBNF of ``spec`` (no tokenizer needed), or ``None`` where xgrammar cannot read it."""
    try:
        import xgrammar as xgr

        from .xgrammar_source import readable_source

        source = readable_source(spec)
        if spec.is_json:
            if spec.any_whitespace:
                grammar = xgr.Grammar.from_json_schema(source, any_whitespace=True)
            else:
                grammar = xgr.Grammar.from_json_schema(source, any_whitespace=False, separators=(",", ":"))
        elif spec.kind == "regex":
            grammar = xgr.Grammar.from_regex(source)
        else:
            grammar = xgr.Grammar.from_ebnf(source, root_rule_name="root")
    except Exception:  # the backend compiling the spec reports its own errors
        return None
    return str(grammar)


@functools.lru_cache(maxsize=512)
def _language(spec: GrammarSpec) -> Language | None:
    ebnf = xgrammar_ebnf(spec)
    if ebnf is None:
        return None
    try:
        return analyse(ebnf)
    except (ValueError, RecursionError):  # a construct this reader does not know: no verdict
        return None


def check_finite(spec: GrammarSpec) -> None:
    """Raise :class:`GrammarError` when ``spec`` (or a part of it the output can enter) has no finite text.

    Worked example::

        >>> check_finite(grammar_spec(schema={"type": "object", "properties": {"x": {"$ref": "#"}},
        ...                                   "required": ["x"]}))
        Traceback (most recent call last):
        GrammarError: the JSON schema accepts no finite value: ...
    """
    language = _language(spec)
    if language is None or not language.never_ends:
        return
    what = "JSON schema" if spec.is_json else "regex" if spec.kind == "regex" else "grammar"
    rules = ", ".join(language.never_ends[:6]) + (", ..." if len(language.never_ends) > 6 else "")
    why = (
        "a required property or item refers back to its own schema ($ref) with no branch that ends"
        if spec.is_json
        else "a rule refers back to itself with no alternative that ends"
    )
    if language.empty:
        raise GrammarError(
            f"the {what} accepts no finite value: {why}, so every answer would be cut off unfinished "
            f"(rules that never end, in xgrammar's reading: {rules}). Give the recursion a way out, such as "
            "making the recursive property optional or adding an anyOf branch without it."
        )
    raise GrammarError(
        f"part of the {what} accepts no finite value: {why}; an answer that enters it can never be completed "
        f"(rules that never end, in xgrammar's reading: {rules}). Give the recursion a way out, such as making "
        "the recursive property optional, or remove that part."
    )


def forced_text_bounded(ebnf: str) -> bool:
    """Whether xgrammar's forced-text search stays cheap on this EBNF, source or compiled.

    No open repetition from :data:`LARGE_REPEAT` up, no rule whose shortest text exceeds :data:`LONG_SHORTEST`.

    ``False`` also for text this reader does not know (no forced text is the safe answer).  Pure.
    """
    try:
        language = analyse(ebnf)
    except (ValueError, RecursionError):
        return False
    longest = max(language.shortest.values(), default=0)
    return not language.never_ends and language.open_repeat < LARGE_REPEAT and longest <= LONG_SHORTEST
