"""A step's integers, built on the host, reach the device in one copy that does not make the host wait.

A CUDA copy from ordinary (pageable) host memory waits for everything queued on
the device before it: ``torch.tensor(values, device="cuda")`` is a host
synchronisation.  A ragged step needs several small integer tensors (the tokens,
their positions, where each token's keys go, which logits to keep, the bounds of
the attention mask); built one by one they cost a synchronisation each.
:func:`to_device` packs them into one host tensor, pins it (PyTorch's caching
host allocator keeps the pinned block until the copy has run) and copies it
without blocking; each array is a view of the one device tensor.  On the CPU the
host tensor is the result: nothing is copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import torch

__all__ = ["to_device"]


def to_device(arrays: Sequence[Sequence[int]], device: torch.device | str) -> list[torch.Tensor]:
    """``arrays`` as int64 tensors on ``device`` (1-D, one per array, views of one tensor), in one copy.

    The values are the host's own (nothing is read back from the device); the copy
    is queued behind the device's work without waiting for it.  Pure.
    """
    device = torch.device(device)
    host = torch.tensor(list(chain.from_iterable(arrays)), dtype=torch.long, device="cpu")
    if device.type == "cuda":
        host = host.pin_memory().to(device, non_blocking=True)
    elif device.type != "cpu":
        host = host.to(device, non_blocking=True)
    return list(host.split([len(a) for a in arrays]))
