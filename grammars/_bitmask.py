"""Bitmask argument checks and padding clean-up shared by the adapters."""

from __future__ import annotations

import torch

from .base import GrammarError, bitmask_width


def check_bitmask(bitmask: torch.Tensor, row: int, vocab_size: int) -> torch.Tensor:
    """Check ``bitmask`` (int32 ``[rows, ceil(vocab_size / 32)]``, CPU, contiguous) and return ``bitmask[row]``."""
    width = bitmask_width(vocab_size)
    if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise GrammarError(
            "the bitmask must be an int32 tensor of shape [rows, ceil(vocab_size / 32)]; "
            "allocate it with grammars.allocate_bitmask(rows, vocab_size)"
        )
    if bitmask.shape[1] != width:
        raise GrammarError(
            f"the bitmask has {bitmask.shape[1]} words per row but this matcher's vocab_size "
            f"{vocab_size} needs {width}; allocate it with grammars.allocate_bitmask(rows, {vocab_size})"
        )
    if bitmask.device.type != "cpu" or not bitmask.is_contiguous():
        raise GrammarError("the bitmask must be a contiguous CPU tensor; copy it to the device after filling")
    if not 0 <= row < bitmask.shape[0]:
        raise GrammarError(f"row {row} is out of range for a bitmask with {bitmask.shape[0]} rows")
    return bitmask[row]


def clear_padding(row: torch.Tensor, vocab_size: int) -> None:
    """Clear the bits past ``vocab_size`` in the last word of one mask row (in place)."""
    used = vocab_size % 32
    if used:
        row[-1] &= (1 << used) - 1
