"""Integration tests with vLLM itself: run in the vLLM environment (``make test-vllm``).

The main environment has no vLLM: there these modules are not collected (``make test`` runs them
afterwards in ``.venv-vllm``).  vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one
executor process less to start) so a test can look at the proposer vLLM built.
"""

from __future__ import annotations

import importlib.util
import os

_spec = importlib.util.find_spec("vllm")  # this folder itself is a namespace package "vllm" (origin None)
if _spec is None or _spec.origin is None:
    collect_ignore_glob = ["test_*.py"]  # the main environment: `make test-vllm` runs these in .venv-vllm
else:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
