"""The output head as one oneDNN matrix product whose weight is laid out once, on the CPU.

The vocabulary projection is a forward's largest matrix product (49152 x 576
for SmolLM2-135M).  On a CPU, MKL's float32 GEMM runs 1 to 3 token rows as
matrix-vector products but from 4 rows on it repacks the whole weight on every
call, so the head of a 5-token verification pass costs about twice a 1-token
step's (``tools/width_cost.py`` measures the forward by width).  oneDNN with the
weight reordered once (torch's mkldnn linear, the kernel torch.compile's CPU
freezing pass uses) costs about as much at 16 rows as at 1, and gives each row
the same logits however many rows share the call.

:func:`prepack_head` swaps a float32 CPU model's head for
:class:`PrepackedLinear`, which shares the head's weight (a tied embedding
stays tied) and keeps a reordered copy beside it: the head's memory twice.
Anything it cannot run (another device or dtype, gradients, a torch without
the kernel) goes through ``torch.nn.functional.linear`` unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional

__all__ = ["PrepackedLinear", "prepack_head"]

#: The row count oneDNN lays the weight out for (a verification pass's width); any count runs.
_ROWS_HINT = 8


class PrepackedLinear(torch.nn.Linear):
    """A ``Linear`` whose float32 CPU forward runs oneDNN on a reordered copy of its weight.

    The copy is rebuilt when the weight's storage or version changes (a weight
    loaded or edited in place after packing).
    """

    _packed: torch.Tensor | None
    _packed_for: tuple[int, int] | None

    @classmethod
    def wrapping(cls, linear: torch.nn.Linear) -> PrepackedLinear:
        """A head sharing ``linear``'s weight and bias Parameters (not copies)."""
        head = cls.__new__(cls)
        torch.nn.Module.__init__(head)
        head.in_features, head.out_features = linear.in_features, linear.out_features
        head.weight = linear.weight
        head.bias = linear.bias
        head._packed, head._packed_for = None, None
        return head

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's own argument name
        weight = self.weight
        if (
            input.device.type != "cpu"
            or weight.device.type != "cpu"
            or input.dtype != torch.float32
            or weight.dtype != torch.float32
            or (torch.is_grad_enabled() and (weight.requires_grad or input.requires_grad))
        ):
            return functional.linear(input, weight, self.bias)
        key = (weight.data_ptr(), weight._version)
        if self._packed_for != key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _ROWS_HINT)
            self._packed_for = key
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(input.contiguous(), self._packed, bias, "none", [], "")


def prepack_head(model: torch.nn.Module) -> bool:
    """Swap ``model``'s float32 CPU output head for :class:`PrepackedLinear`; whether it did.

    Leaves the model as it was where the head is no plain ``Linear`` on the CPU
    in float32, or where this torch lacks the kernel or disagrees with
    ``functional.linear`` on a probe.
    """
    hf: Any = model  # a Hugging Face model
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear or not hasattr(hf, "set_output_embeddings"):
        return False
    if head.weight.device.type != "cpu" or head.weight.dtype != torch.float32:
        return False
    packed = PrepackedLinear.wrapping(head)
    probe = torch.randn((5, head.in_features), generator=torch.Generator().manual_seed(0), device=head.weight.device)
    try:
        with torch.inference_mode():
            got, want = packed(probe), functional.linear(probe, head.weight, head.bias)
    except (RuntimeError, AttributeError, NotImplementedError):  # a torch built without oneDNN
        return False
    scale = float(want.abs().max()) or 1.0
    if got.shape != want.shape or float((got - want).abs().max()) > 1e-4 * scale:
        return False
    hf.set_output_embeddings(packed)
    return True
