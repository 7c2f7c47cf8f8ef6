"""Shared fixtures: the embedded real model (loaded once), the toy tokenizer (``tok``, and ``chat`` with a chat
template) with tiny random Llamas over it (``model``, ``chat_model``) and a prompt, the embedded model's tokenizer
over a tiny random Llama (``smol_chat``), and the data sample.  Shared constants (schemas, tools) and the
exactness harness are in tests/helpers.py; the toy vocabularies in tests/toy.py.

The benchmark tasks and the schema corpus come from the repository's ``data/``
folder (``$GRAMMARSPEC_TASKS`` / ``$GRAMMARSPEC_SCHEMAS`` name others), read by
the one loader, :mod:`grammarspec.bench.tasks`.  A test that uses the ``tasks``
fixture reads the fixed benchmark task file, so it is marked ``bench``
(``make test`` runs it; ``make test-fast`` leaves it out).
"""

from __future__ import annotations

import os

import pytest
import torch

from grammarspec.bench.tasks import read_task_records
from tests.toy import toy_chat_tokenizer, toy_tokenizer, toy_vocab_size
from tests.toy_models import tiny_llama

# The suite's greedy-parity and seeded tests compare runs: a draft length that depends on a
# profile of this machine's pass times would move floating-point ties between them.  The fixed
# CPU prior keeps them reproducible (subprocesses inherit it); tests/drafting/test_pass_profile.py sets "profile".
os.environ.setdefault("GRAMMARSPEC_PASS_COST", "prior")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One process per core under pytest-xdist: two OpenMP threads per worker on a
    # 2-core machine would fight each other and slow every forward pass down.
    torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that reads the benchmark task file (the ``tasks`` fixture) ``bench``."""
    for item in items:
        if "tasks" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.bench)


@pytest.fixture(scope="session")
def smol():
    """``(model, tokenizer)`` of the embedded SmolLM2-135M-Instruct, loaded once."""
    from grammarspec.model.loading import load_model

    torch.manual_seed(0)
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def smol_tokenizer():
    from grammarspec.model.loading import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="session")
def tasks() -> list[dict]:
    """The records of the benchmark task file (``data/tasks/tasks.jsonl`` or ``$GRAMMARSPEC_TASKS``)."""
    return read_task_records()


@pytest.fixture(scope="module")
def grammars():
    """The batch tests' schemas (helpers.SCHEMAS) compiled over the toy tokenizer, one per row."""
    from grammars import compile_grammar, grammar_spec
    from tests.helpers import SCHEMAS

    tok = toy_tokenizer()
    return [compile_grammar(grammar_spec(schema=s), tok, vocab_size=len(tok), stop_token_ids=(0,)) for s in SCHEMAS]


@pytest.fixture(scope="module")
def tok():
    """A fresh toy tokenizer per module (tests/toy.py): 56 tokens, ``</s>`` (id 0) its EOS."""
    return toy_tokenizer()


@pytest.fixture(scope="module")
def model():
    """A tiny random Llama over the toy vocabulary (seed 0), one per module."""
    return tiny_llama(toy_vocab_size(), seed=0)


@pytest.fixture(scope="module")
def prompt(tok):
    """A one-row prompt for :func:`model`: ``{b:1}`` in the toy tokenizer."""
    return torch.tensor([tok("{b:1}", add_special_tokens=False)["input_ids"]])


@pytest.fixture(scope="module")
def chat():
    """The toy tokenizer with a chat template (tests/toy.py's ``TOY_CHAT_TEMPLATE``), one per module."""
    return toy_chat_tokenizer()


@pytest.fixture(scope="module")
def chat_model(chat):
    """A tiny random Llama over :func:`chat`'s vocabulary (seed 3), one per module."""
    return tiny_llama(toy_vocab_size(chat), seed=3)


@pytest.fixture(scope="module")
def smol_chat(smol_tokenizer):
    """``(model, tokenizer)``: a tiny random Llama over the embedded model's tokenizer (its chat template)."""
    return tiny_llama(len(smol_tokenizer), seed=0), smol_tokenizer


@pytest.fixture(autouse=True)
def _no_earlier_outputs():
    """Each test starts with no earlier outputs to draft from: greedy calls share one index per model and
    thread (grammarspec.drafting.earlier_outputs), and a test's counts must not depend on which ran before."""
    import grammarspec

    grammarspec.forget_earlier_outputs()
