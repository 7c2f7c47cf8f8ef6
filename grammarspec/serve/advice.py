"""The library's advice in the words of a client of the server.  Pure.

The grammar layer's errors advise Python keywords (``grammar_backend='outlines'``,
``compile_timeout=...``).  A client of the server sets the backend per request
(``"grammarspec": {"grammar_backend": "outlines"}``) and cannot set the
compile limit (the server's ``--compile-timeout``), so :func:`client_words`
rewrites the advice into what the client, or the server's operator, can do.
"""

from __future__ import annotations

import re

__all__ = ["client_words"]

_REWRITES: tuple[tuple[str, str], ...] = (
    (r"(?:grammar_)?backend='(\w+)'", r'"grammarspec": {"grammar_backend": "\1"} in the request'),
    (
        r"or compile without compile_timeout to see the backend's own error",
        "or ask the server's operator to raise its --compile-timeout",
    ),
    (r"raise it to find out", "a higher --compile-timeout (set by the server's operator) would find out"),
    (r"[Rr]aise compile_timeout", "ask the server's operator to raise its --compile-timeout"),
    (r"compile_timeout=([\d.e+]+) s", r"the server's --compile-timeout of \1 s"),
    (r"pass compile_timeout=SECONDS", "start the server with --compile-timeout SECONDS"),
    (
        r"every finished result carries stats\.valid and stats\.schema_errors \(grammars\.validation\.output_errors\)",
        "every answer's grammarspec.choices[].valid and schema_errors say whether it validates",
    ),
)


def client_words(message: str) -> str:
    """``message`` with Python-API-only advice replaced by what a client of the server can do."""
    for pattern, replacement in _REWRITES:
        message = re.sub(pattern, replacement, message)
    return message
