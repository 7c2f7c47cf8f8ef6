"""A tiny in-memory Hugging Face tokenizer for grammar and decoding unit tests.

The vocabulary (55 tokens) covers small compact JSON documents: the structural
characters, digits, lower-case letters, space, newline, ``-``, ``.`` and a few
multi-character tokens (``{"``, ``":``, ``"a``, ``"a"``, ``",``, ``},``) so
that a text has several tokenisations, as with a real tokenizer.  Token
strings are plain text (no byte-level or sentencepiece encoding, no decoder),
so every backend decodes them the same way: xgrammar sees a RAW vocabulary and
outlines-core sees the token strings themselves.

Ids: ``</s>`` = 0 (EOS), ``<pad>`` = 1, then the single characters, then the
multi-character tokens.  Built deterministically, no files, no downloads.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["TOY_EOS", "TOY_PAD", "toy_tokenizer", "toy_vocab", "toy_vocab_size"]

TOY_EOS = "</s>"
TOY_PAD = "<pad>"

_SINGLE = list('{}[]":,') + [str(d) for d in range(10)] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
_SINGLE += [" ", "\n", "-", "."]
# (left, right) merges in priority order; each produces left + right.
_MERGES = [('{', '"'), ('"', ':'), ('"', 'a'), ('"a', '"'), ('"', ','), ('}', ',')]


def toy_vocab() -> dict[str, int]:
    """Token string -> id for the toy vocabulary (``</s>`` is 0, ``<pad>`` is 1)."""
    tokens = [TOY_EOS, TOY_PAD] + _SINGLE + [left + right for left, right in _MERGES]
    return {token: i for i, token in enumerate(tokens)}


@lru_cache(maxsize=1)
def _toy_tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import BPE

    # No normalizer and no pre-tokenizer: the whole text is one BPE "word".  The
    # Fuse decoder concatenates token strings, so tokens decode to themselves
    # (xgrammar detects a RAW vocabulary).
    model = BPE(vocab=toy_vocab(), merges=list(_MERGES), unk_token=None, ignore_merges=False)
    tokenizer = Tokenizer(model)
    tokenizer.decoder = decoders.Fuse()
    return tokenizer.to_str()


def toy_tokenizer():
    """A fresh ``transformers.PreTrainedTokenizerFast`` over the toy vocabulary.

    ``eos_token`` is ``</s>`` (id 0) and ``pad_token`` is ``<pad>`` (id 1).
    ``len(tok) == toy_vocab_size(tok) == 55``.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_toy_tokenizer_json()),
        eos_token=TOY_EOS,
        pad_token=TOY_PAD,
        clean_up_tokenization_spaces=False,
    )
    tok.name_or_path = "toy-json-55"
    return tok


def toy_vocab_size(tok=None) -> int:
    """The logits width matching the toy vocabulary (``len(tokenizer)``)."""
    return len(tok) if tok is not None else len(toy_vocab())
