"""An oracle target model: a causal LM whose greedy choice is a recorded output.

Under greedy decoding the output does not depend on the drafter, so running the
real decoding loop (:func:`grammarspec.engine.decoding.decode`) against a model that
always prefers the recorded output's next token shows exactly what each draft
would have got -- target passes without the target.  The replay script and the
test replay use it; neither carries a copy of the loop.

``split_bytes`` (token id -> bytes) turns it into a bound rather than a model:
where the next input of the pass (the drafted token) spells the same text as
the output with other tokens, the oracle prefers the drafted token -- what a
perfect predictor of the target's token splits would add.  The text stays the
output's, the tokens may differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch
from transformers import DynamicCache

from grammarspec.bench.tiny_llama import tiny_llama_config

__all__ = ["OracleLM"]

#: Logit of the preferred token (every other token gets 0).
PEAK = 50.0


class OracleLM(torch.nn.Module):
    """Prefers ``output[len(generated)]`` after ``prompt + generated``; batch 1, with a real ``DynamicCache``.

    >>> lm = OracleLM(prompt=[5], output=[7, 8, 0], vocab_size=10)
    >>> int(lm.next_logits([5]).argmax()), int(lm.next_logits([5, 7]).argmax())
    (7, 8)
    """

    def __init__(
        self,
        prompt: Sequence[int],
        output: Sequence[int],
        vocab_size: int,
        *,
        eos_token_id: int = 0,
        split_bytes: Sequence[bytes] | None = None,
    ) -> None:
        super().__init__()
        self.prompt, self.output = list(prompt), list(output)
        self.vocab_size = vocab_size
        self.config = tiny_llama_config(
            vocab_size, hidden_size=8, intermediate_size=8, num_attention_heads=1, eos_token_id=eos_token_id
        )
        self.device = torch.device("cpu")
        self.split_bytes = split_bytes
        if split_bytes is not None:
            self._text = b"".join(split_bytes[t] for t in self.output)
            ends, at = set(), 0
            for t in self.output:
                at += len(split_bytes[t])
                ends.add(at)
            self._ends = ends

    def get_output_embeddings(self) -> None:
        return None

    def next_logits(self, context: Sequence[int], next_input: int | None = None) -> torch.Tensor:
        """Logits ``[V]`` for the token after ``context`` (``next_input``: the pass's next input, if any)."""
        generated = list(context[len(self.prompt) :])
        token = self._choice(generated, next_input)
        logits = torch.zeros(self.vocab_size)
        logits[token] = PEAK
        return logits

    def _choice(self, generated: list[int], next_input: int | None) -> int:
        if self.split_bytes is None:
            return self.output[min(len(generated), len(self.output) - 1)]
        table = self.split_bytes
        done = b"".join(table[t] for t in generated)
        if not self._text.startswith(done):
            return self.output[-1]  # off the output: any choice, the loop never commits it
        if next_input is not None and next_input < len(table) and table[next_input]:
            after = done + table[next_input]
            if self._text.startswith(after):
                return next_input  # the draft spells the output's text: take its split
        if len(done) in self._ends or not done:  # aligned: the output's own next token
            index = sum(1 for end in self._ends if end <= len(done))
            return self.output[min(index, len(self.output) - 1)]
        # Inside an output token (a merged split was taken): the longest token up to its end.
        end = min(e for e in self._ends if e > len(done))
        want = self._text[len(done) : end]
        best = max((t for t, b in enumerate(table) if b and want.startswith(b)), key=lambda t: len(table[t]))
        return best

    def forward(self, input_ids, cache=None, use_cache=True, logits_to_keep=0, attention_mask=None, **_: object):
        """Causal, or a token tree: with a 4-D additive ``attention_mask`` each row sees the columns marked 0."""
        new = input_ids[0].tolist()
        past: list[int] = []
        if cache is not None and cache.get_seq_length() > 0:
            past = cache.layers[0].keys[0, 0, :, 0].long().tolist()
        if cache is not None:
            states = torch.tensor(new, dtype=torch.float32).reshape(1, 1, -1, 1)
            cache.update(states, states, 0)
        rows, context = [], past
        tree = attention_mask is not None and attention_mask.dim() == 4
        columns = past + new
        for j, token in enumerate(new):
            if tree:  # a tree node's context: the committed tokens and its ancestors
                visible = (attention_mask[0, 0, j] == 0).tolist()
                context = [t for t, seen in zip(columns, visible) if seen]
                rows.append(self.next_logits(context))
                continue
            context = context + [token]
            rows.append(self.next_logits(context, new[j + 1] if j + 1 < len(new) else None))
        logits = torch.stack(rows)[None]  # [1, n, V]
        if isinstance(logits_to_keep, torch.Tensor):  # the batched pass's [1, n] boolean rows to keep
            logits = logits[:, logits_to_keep[0]]
        elif logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return SimpleNamespace(logits=logits)

    def spelled_tokens(self, generated: Sequence[int]) -> int:
        """How many output tokens ``generated`` spells (its own count unless splitting)."""
        if self.split_bytes is None:
            return len(generated)
        done = len(b"".join(self.split_bytes[t] for t in generated))
        return sum(1 for end in self._ends if end <= done)


def new_oracle_cache() -> DynamicCache:
    return DynamicCache()
