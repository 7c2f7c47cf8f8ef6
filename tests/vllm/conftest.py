"""grammarspec.vllm's tests: the proposer against stand-ins (test_proposer.py, test_draft_index.py) and vLLM itself (test_vllm_*.py).

The main environment has no vLLM: there the vLLM modules are not collected (``make test`` runs them afterwards in
``.venv-vllm``: ``make test-vllm``), and the stand-ins run there alone.  vLLM runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one executor process less to start) so a test can look at the proposer
vLLM built.
"""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_vllm_*.py"]  # the main environment: `make test-vllm` runs these in .venv-vllm
else:
    collect_ignore = [
        "test_proposer.py",
        "test_draft_index.py",
    ]  # stand-ins for vLLM's objects: run in the main environment
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
