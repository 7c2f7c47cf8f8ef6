"""A tiny in-memory Hugging Face tokenizer for grammar and decoding unit tests.

The vocabulary (56 tokens) covers small compact JSON documents: the structural
characters, digits, lower-case letters, space, newline, ``-``, ``.``, ``_`` and a few
multi-character tokens (``{"``, ``":``, ``"a``, ``"a"``, ``",``, ``},``) so
that a text has several tokenisations, as with a real tokenizer.  Token
strings are plain text (no byte-level or sentencepiece encoding; the decoder
only concatenates), so every backend decodes them the same way: xgrammar sees a RAW vocabulary and
outlines-core sees the token strings themselves.  Characters outside the
vocabulary are dropped by ``encode`` (there is no unknown token): check
``decode(encode(text)) == text`` in tests.

Ids: ``</s>`` = 0 (EOS), ``<pad>`` = 1, then the single characters, then the
multi-character tokens, then ``_``.  Built deterministically, no files, no downloads.

Two more toys exercise the other token encodings real tokenizers use:
:func:`toy_byte_level_tokenizer` (GPT-2 style, like SmolLM2) and
:func:`toy_byte_fallback_tokenizer` (SentencePiece style, ``▁`` and ``<0xNN>``).
"""

from __future__ import annotations

from functools import lru_cache

__all__ = [
    "TOY_EOS",
    "TOY_PAD",
    "toy_tokenizer",
    "toy_vocab",
    "toy_vocab_size",
    "toy_byte_level_tokenizer",
    "toy_byte_fallback_tokenizer",
]

TOY_EOS = "</s>"
TOY_PAD = "<pad>"

_SINGLE = list('{}[]":,') + [str(d) for d in range(10)] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
_SINGLE += [" ", "\n", "-", "."]
# (left, right) merges in priority order; each produces left + right.
_MERGES = [("{", '"'), ('"', ":"), ('"', "a"), ('"a', '"'), ('"', ","), ("}", ",")]


def toy_vocab() -> dict[str, int]:
    """Token string -> id for the toy vocabulary (``</s>`` is 0, ``<pad>`` is 1)."""
    # "_" came last, after the merges, so that the older ids did not move.
    tokens = [TOY_EOS, TOY_PAD] + _SINGLE + [left + right for left, right in _MERGES] + ["_"]
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
    ``len(tok) == toy_vocab_size(tok) == 56``.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_toy_tokenizer_json()),
        eos_token=TOY_EOS,
        pad_token=TOY_PAD,
        clean_up_tokenization_spaces=False,
    )
    tok.name_or_path = "toy-json-56"
    return tok


#: A minimal chat template over the toy vocabulary: one line per message, ``role initial:content``.
TOY_CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}a:{% endif %}"


def toy_chat_tokenizer():
    """:func:`toy_tokenizer` with :data:`TOY_CHAT_TEMPLATE`, for the chat paths (``Conversation``, the server)."""
    tok = toy_tokenizer()
    tok.chat_template = TOY_CHAT_TEMPLATE
    return tok


def toy_vocab_size(tok=None) -> int:
    """The logits width matching the toy vocabulary (``len(tokenizer)``)."""
    return len(tok) if tok is not None else len(toy_vocab())


def _gpt2_byte_chars() -> list[str]:
    """GPT-2's printable stand-in character for each byte 0..255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def toy_byte_level_tokenizer():
    """A GPT-2 style byte-level tokenizer: ``<|end|>`` (EOS, id 0), the 256 byte characters, 3 merges.

    ``é`` is two tokens (``Ã``, ``©``); a space is ``Ġ``.
    """
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|end|>": 0}
    for char in _gpt2_byte_chars():
        vocab[char] = len(vocab)
    merges = [("{", '"'), ("Ġ", "a"), ('"', ":")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|end|>", pad_token="<|end|>")
    tok.name_or_path = "toy-byte-level"
    return tok


def toy_byte_fallback_tokenizer():
    """A SentencePiece style tokenizer: ``<unk>``, ``</s>`` (EOS, id 1), ``<0x00>``..``<0xFF>``,
    JSON characters, lower-case letters, ``▁`` and 2 merges.  Other characters fall back to bytes.
    """
    from tokenizers import Tokenizer, decoders, normalizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for char in [*'{}[]":,', *(chr(c) for c in range(ord("a"), ord("z") + 1)), "\u2581"]:
        vocab[char] = len(vocab)
    merges = [("\u2581", "a"), ("{", '"')]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", unk_token="<unk>", pad_token="<unk>")
    tok.name_or_path = "toy-byte-fallback"
    return tok
