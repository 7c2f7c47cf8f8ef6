"""grammarspec/vllm: the vLLM proposer (stand-ins here, vLLM itself in .venv-vllm)."""
