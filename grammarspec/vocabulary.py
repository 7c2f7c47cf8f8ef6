"""Does this tokenizer belong to this model?  The check of the model's vocabulary against the tokenizer's.

A tokenizer from another family decodes the model's ids as other text (a
Qwen2 tokenizer on a Llama 2 model decodes ``{"a":9}`` as something else) and
masks the grammar over ids the model does not have.  Two numbers tell:

* **tokens the model cannot emit**: the tokenizer's base vocabulary (its
  model's tokens, added tokens aside) reaches past the model's logits, or
  added tokens that are not special do;
* **ids the tokenizer does not know**: the model's logits reach far past the
  tokenizer.  Models pad their vocabulary (Qwen2: 151,936 logits for 151,665
  tokens; Phi-3: 32,064 for 32,011), so a padding of up to a quarter of the
  tokenizer is accepted, and the grammar never allows the padded ids.

Special tokens added past the model's logits are accepted: converters add
some (a GGUF tokenizer re-declares ``<|endoftext|>``), and the model never has
to write them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VocabularyMismatch", "check_vocabulary", "MAX_PADDING_FRACTION"]

#: The most logits past the tokenizer's tokens, as a fraction of them, that count as padding.
MAX_PADDING_FRACTION = 0.25


class VocabularyMismatch(ValueError):
    """The tokenizer and the model do not share a vocabulary."""


def check_vocabulary(model_vocab: int, tokenizer: Any) -> None:
    """Raise :class:`VocabularyMismatch` (with the numbers) when ``tokenizer`` cannot be ``model``'s.

    ``model_vocab``: the width of the model's logits.  Changes nothing.
    """
    if tokenizer is None or model_vocab <= 0:
        return
    try:
        total = len(tokenizer)
    except TypeError:
        return
    base = int(getattr(tokenizer, "vocab_size", 0) or 0) or total
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    plain_past = sorted(
        i for i, token in added.items() if i >= max(model_vocab, base) and not getattr(token, "special", False)
    )
    fix = (
        "Load the tokenizer saved with this model (AutoTokenizer.from_pretrained on the model's folder or Hub id), "
        "or a model of the tokenizer's family."
    )
    if base > model_vocab or plain_past:
        count = max(base - model_vocab, 0) + len(plain_past)
        first = min([model_vocab] if base > model_vocab else plain_past)
        raise VocabularyMismatch(
            f"the tokenizer has {count:,} tokens the model cannot emit: its vocabulary has {total:,} tokens "
            f"({base:,} without added tokens) but the model's logits have {model_vocab:,}, so ids from {first:,} "
            f"on have no logit. The tokenizer is not this model's. {fix}"
        )
    unknown = model_vocab - total
    if unknown > MAX_PADDING_FRACTION * total:
        raise VocabularyMismatch(
            f"the model has {unknown:,} ids the tokenizer does not know: its logits have {model_vocab:,} entries "
            f"but the tokenizer has {total:,} tokens, far more than padding explains (at most "
            f"{MAX_PADDING_FRACTION:.0%} of the tokenizer). The tokenizer is not this model's. {fix}"
        )
