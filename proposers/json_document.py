"""The JSON document generated so far, and the prompt it copies from.

:class:`Document` holds the committed tokens of one answer, a
:class:`~proposers.json_cursor.Cursor` after each of them, and what happened
where: the decision points (by signature), the values (by path), where in the
prompt the latest copied value came from, and which delimiters ended copied
values.  :meth:`Document.feed` appends tokens; :meth:`Document.truncate` goes
back to fewer tokens and undoes everything the dropped tokens recorded (an
undo log keyed by token index), so ``truncate(n)`` after ``feed`` leaves no
trace.  :class:`Prompt` is the prompt as JSON-escaped text (values are copied
from it as they would be written inside a JSON string).

Worked example (one byte per token, no schema)::

    >>> doc = Document(SchemaIndex(None), Prompt.from_text(b"Ada is 36."), BYTE_TOKENS)
    >>> doc.feed(list(b'{"name":"Ada","age":36}'))
    >>> doc.values[(b"name",)], doc.values[(b"age",)], doc.prompt_cursor
    ([b'"Ada"'], [b'36'], 9)
    >>> doc.truncate(14)  # back to '{"name":"Ada",'
    >>> doc.values[(b"age",)], doc.prompt_cursor
    ([], 3)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .json_cursor import Cursor, Path, advance, normalize, signature, value_path
from .prompt_spans import delimiters, escape_text, find_near, near_cost, number_spans
from .schema_nav import SchemaIndex

__all__ = ["Document", "Prompt", "prompt_start", "BYTE_TOKENS"]

#: A vocabulary of one token per byte (token ``i`` spells ``bytes([i])``): for examples and tests.
BYTE_TOKENS: tuple[bytes, ...] = tuple(bytes((i,)) for i in range(256))


def prompt_start(segments: Sequence[bytes], min_length: int = 32) -> int:
    """Offset of the last substantial segment of a prompt split at special tokens.

    The prompt cursor starts there: in a chat prompt, that is the user's
    message (the system text before it may quote the schema).

    ``prompt_start([b'system...', b'user\\\\nlong message ...', b'assistant\\\\n'])``
    is the offset of the second segment when it is at least ``min_length`` long.
    """
    offset, best = 0, 0
    for segment in segments:
        if len(segment) >= min_length:
            best = offset
        offset += len(segment)
    return best


@dataclass(frozen=True)
class Prompt:
    """The prompt as JSON-escaped text (a plain value).

    ``text``: escaped bytes; ``lower``: the same, lower-cased; ``numbers``:
    :func:`~proposers.prompt_spans.number_spans` of it; ``start``: where
    copying may begin (in a chat prompt: the user's message).
    """

    text: bytes
    lower: bytes
    numbers: tuple[tuple[int, int, bytes], ...]
    start: int = 0

    @classmethod
    def from_text(cls, text: bytes, start: int = 0) -> Prompt:
        """A prompt from already escaped ``text``.  ``Prompt.from_text(b"x 1").numbers == ((2, 3, b'1'),)``."""
        return cls(text, text.lower(), tuple(number_spans(text)), start)

    @classmethod
    def from_ids(cls, prompt_ids: Sequence[int], token_bytes: Sequence[bytes], special: frozenset[int]) -> Prompt:
        """The prompt of ``prompt_ids``, escaped piece by piece between special tokens.

        Escaping is per character, so the pieces concatenate to the escaped
        whole; ``start`` is the :func:`prompt_start` of the pieces.
        """
        segments: list[bytes] = []
        run: list[int] = []
        for token in list(prompt_ids) + [-1]:
            if token in special or token == -1:
                data = b"".join(token_bytes[t] for t in run if 0 <= t < len(token_bytes))
                segments.append(escape_text(data.decode("utf-8", errors="replace")))
                run = []
            else:
                run.append(int(token))
        return cls.from_text(b"".join(segments), prompt_start(segments))


class Document:
    """The generated JSON with a cursor per token and a record of what happened where.

    ``points``: decision-point signature -> offsets where it occurred.
    ``values``: normalized value path -> the values' JSON texts, in order.
    ``prompt_cursor``: escaped-prompt offset after the latest value found in
    the prompt.  ``endings``: per value path, how often each delimiter ended
    a copied value or occurred inside one.  ``token_bytes``: the bytes of each
    token id; ``skip``: ids that add no text (special tokens).  ``past``:
    earlier documents of the conversation (most recent first, read only; see
    :meth:`of_text`), whose decision points the history sources also consult.
    """

    def __init__(
        self,
        schema: SchemaIndex,
        prompt: Prompt,
        token_bytes: Sequence[bytes] = BYTE_TOKENS,
        skip: frozenset[int] = frozenset(),
    ) -> None:
        self.schema = schema
        self.prompt = prompt
        self.token_bytes = token_bytes
        self.skip = skip
        self.text = bytearray()
        self.tokens: list[int] = []
        self.cursors: list[Cursor] = [Cursor()]  # cursor after i tokens
        self.ends: list[int] = [0]  # text length after i tokens
        self.points: dict[tuple[Any, ...], list[int]] = {}
        self.values: dict[Path, list[bytes]] = {}
        self.endings: dict[Path, Counter[tuple[bytes, str]]] = {}
        self.prompt_cursor = prompt.start
        self.past: tuple[Document, ...] = ()
        self._undo: list[tuple[int, Callable[[], object]]] = []  # (index of the token that did it, how to undo)

    @classmethod
    def of_text(cls, text: str) -> Document:
        """A finished document from its JSON ``text`` (an earlier turn's call or answer), one token per byte.

        >>> doc = Document.of_text('{"city":"Oslo"}')
        >>> doc.values[(b"city",)]
        [b'"Oslo"']
        """
        doc = cls(SchemaIndex(None), Prompt.from_text(b""))
        doc.feed(list(text.encode("utf-8")))
        return doc

    @property
    def cursor(self) -> Cursor:
        """The cursor after the last token."""
        return self.cursors[-1]

    def feed(self, tokens: Sequence[int]) -> None:
        """Append ``tokens``.  Changes state."""
        table, skip = self.token_bytes, self.skip
        for token in tokens:
            token = int(token)
            data = b"" if token in skip or not 0 <= token < len(table) else table[token]
            self.text += data
            self.cursors.append(advance(self.cursor, data, self.schema, self._event) if data else self.cursor)
            self.ends.append(len(self.text))
            self.tokens.append(token)

    def truncate(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` tokens; undo everything recorded after them.  Changes state."""
        del self.tokens[n_tokens:]
        del self.cursors[n_tokens + 1 :]
        del self.ends[n_tokens + 1 :]
        del self.text[self.ends[-1] :]
        # By token, not by byte: a value ends when the character after it comes, so the
        # token after a cut may record a value that ends exactly at the cut.
        while self._undo and self._undo[-1][0] >= n_tokens:
            self._undo.pop()[1]()

    def _event(self, kind: str, cursor: Cursor, start: int = 0, end: int = 0) -> None:
        if kind == "point":
            sig = signature(cursor)
            if sig is not None:
                offsets = self.points.setdefault(sig, [])
                offsets.append(cursor.offset)
                self._undo.append((len(self.tokens), offsets.pop))
            return
        path = normalize(value_path(cursor))
        value = bytes(self.text[start:end])
        values = self.values.setdefault(path, [])
        values.append(value)
        self._undo.append((len(self.tokens), values.pop))
        self._note_copy(path, value)

    def _note_copy(self, path: Path, value: bytes) -> None:
        """Move the prompt cursor past ``value`` if it came from the prompt; learn its delimiters."""
        where = self.locate(value)
        if where is None:
            return
        start, stop = where
        previous = self.prompt_cursor
        self.prompt_cursor = stop

        def undo_cursor() -> None:
            self.prompt_cursor = previous

        self._undo.append((len(self.tokens), undo_cursor))
        if value[:1] == b'"':
            inside, at_end = delimiters(self.prompt.text, start, stop)
            counts = self.endings.setdefault(path, Counter())
            changes = Counter({(d, "in"): 1 for d in inside})
            if at_end is not None:
                changes[(at_end, "end")] += 1
            counts.update(changes)
            self._undo.append((len(self.tokens), lambda: counts.subtract(changes)))

    def locate(self, value: bytes) -> tuple[int, int] | None:
        """The prompt span (escaped offsets) a string or number value was most likely copied from.

        Only the prompt from ``prompt.start`` on counts (in a chat prompt: the
        user's message; a system text before it may quote the schema's enums).
        Does not change state.
        """
        prompt = self.prompt
        floor, cursor = prompt.start, self.prompt_cursor
        if len(value) >= 4 and value[:1] == b'"' and value[-1:] == b'"':
            content = value[1:-1]
            pos = find_near(prompt.text[floor:], content, cursor - floor)
            if pos < 0:
                pos = find_near(prompt.lower[floor:], content.lower(), cursor - floor)
            return (floor + pos, floor + pos + len(content)) if pos >= 0 else None
        if value[:1] in b"-0123456789" and value:
            try:
                number = float(value)
            except ValueError:
                return None
            spans = [(near_cost(s, cursor), s, e) for s, e, v in prompt.numbers if s >= floor and float(v) == number]
            if spans:
                _, s, e = min(spans)
                return s, e
        return None

    def ignored_delimiters(self, path: Path) -> set[bytes]:
        """Delimiters seen inside values at ``path`` more often than ending them.  Does not change state."""
        counts = self.endings.get(path)
        if not counts:
            return set()
        return {d for (d, where), n in counts.items() if where == "in" and n > counts[(d, "end")]}

    def repeat_rate(self, path: Path) -> float:
        """How often values at ``path`` repeat an earlier one (smoothed; 0.25 with one value)."""
        values = self.values.get(path, ())
        return (len(values) - len(set(values)) + 0.5) / (len(values) + 1)

    def earlier(self, sig: tuple[Any, ...], before: int) -> list[int]:
        """Offsets of ``sig`` before offset ``before``, most recent first."""
        return [o for o in reversed(self.points.get(sig, ())) if o < before]
