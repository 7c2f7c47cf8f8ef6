"""Shared fixtures: the embedded real model (loaded once) and tiny random models."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared"

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One process per core under pytest-xdist: two OpenMP threads per worker on a
    # 2-core machine would fight each other and slow every forward pass down.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smol():
    """``(model, tokenizer)`` of the embedded SmolLM2-135M-Instruct, loaded once."""
    from grammarspec.loading import load_model

    torch.manual_seed(0)
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def smol_tokenizer():
    from grammarspec.loading import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="session")
def tasks() -> list[dict]:
    """The benchmark tasks of ../shared/tasks/tasks.jsonl."""
    path = SHARED / "tasks" / "tasks.jsonl"
    if not path.is_file():
        pytest.fail(f"benchmark tasks not found at {path}: the shared/ folder must sit beside the checkout")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def shared_schemas(category: str | None = None) -> list[dict]:
    """Records of ../shared/schemas/*.jsonl (one category or all)."""
    folder = SHARED / "schemas"
    files = [folder / f"{category}.jsonl"] if category else sorted(folder.glob("*.jsonl"))
    records = []
    for f in files:
        records += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return records
