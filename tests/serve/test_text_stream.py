"""grammarspec.serve.text_stream: a choice's text kept as its tokens arrive equals the whole answer decoded.

Checked on real vocabularies: SmolLM2's byte-level BPE and the shipped Llama 2 and Phi-3 SentencePiece ones
(byte fallback: a character can span several tokens), on text with accents, emoji, CJK, runs of spaces,
tabs and newlines, on random token ids, and with a special token inside.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from grammarspec.bench.families import load_family_tokenizer
from grammarspec.serve.text_stream import TextStream, streams_exactly

DATA = Path(__file__).resolve().parents[2] / "data" / "tokenizers"
TEXTS = [
    '{"name": "Ana  Lee", "size": "extra large", "n": 42}',
    "Héllo wörld — ünïcode ✓ 🎉 日本語のテキスト",
    "  leading spaces\n\n\ttabs and\r\nnewlines",
    "def f(x):\n    return x ** 2  # ok",
    " . , ! ? ' \" don't it's",
]


@pytest.fixture(scope="module", params=["smollm2", "llama-spm", "phi-3"])
def tokenizer(request, smol_tokenizer):
    if request.param == "smollm2":
        return smol_tokenizer
    return load_family_tokenizer(DATA / f"ggml-vocab-{request.param}.gguf")


@pytest.fixture(scope="module")
def smol_tokenizer(smol):
    return smol[1]


def _sequences(tokenizer):
    rng = random.Random(0)
    encoded = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    special = sorted(tokenizer.all_special_ids)[:1]
    return (
        encoded
        + [ids[:5] + special + ids[5:] for ids in encoded[:2]]
        + [[rng.randrange(len(tokenizer)) for _ in range(40)] for _ in range(10)]
    )


def test_the_text_kept_as_tokens_arrive_is_the_whole_decode_at_every_commit(tokenizer):
    assert streams_exactly(tokenizer)
    for ids in _sequences(tokenizer):
        stream = TextStream(tokenizer)
        assert stream.incremental
        at, commits = 0, random.Random(len(ids))
        while at < len(ids):
            step = commits.randint(1, 4)  # commits of one token and of several (accepted drafts)
            text = stream.add(ids[at : at + step])
            at += step
            whole = tokenizer.decode(ids[:at], skip_special_tokens=True)
            assert whole.startswith(text)  # never ahead of the whole decode, never different
            if not whole.endswith("\ufffd"):  # a character whose bytes are all in: nothing held back
                assert text == whole


def test_a_tokenizer_whose_decode_does_more_is_decoded_whole(smol_tokenizer):
    class Cleaning(type(smol_tokenizer)):
        def _decode(self, *args, **kwargs):
            return super()._decode(*args, **kwargs).replace(" ,", ",")

    cleaning = Cleaning.__new__(Cleaning)
    cleaning.__dict__.update(smol_tokenizer.__dict__)
    ids = smol_tokenizer("a , b , c", add_special_tokens=False)["input_ids"]
    assert not streams_exactly(cleaning)
    stream = TextStream(cleaning)
    assert not stream.incremental
    for i in range(len(ids)):
        assert stream.add(ids[i : i + 1]) == cleaning.decode(ids[: i + 1], skip_special_tokens=True)
    assert stream.text == "a, b, c"


def test_a_tokenizer_that_cleans_up_spaces_is_decoded_whole(smol_tokenizer, monkeypatch):
    monkeypatch.setattr(smol_tokenizer, "clean_up_tokenization_spaces", True)
    assert not streams_exactly(smol_tokenizer)
    assert not TextStream(smol_tokenizer).incremental
