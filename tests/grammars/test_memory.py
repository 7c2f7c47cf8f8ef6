"""Resident memory stays bounded over many grammar calls on every backend, timeouts included.

Each test runs in a fresh process (``tools/memory_check.py`` or a short
script), so other tests' allocations do not blur the readings.  Bounds are in
tens of MB: the leak the issue reported grew by gigabytes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_memory_is_flat_after_a_warm_up_on_every_backend_with_timeouts():
    """Two rounds over 8 sample schemas x (xgrammar, outlines, llguidance, auto), a small cache so that every
    round compiles again, and a new outlines compile killed at a 0.05 s deadline every 8th call."""
    result = _run(
        [
            "tools/memory_check.py",
            "--tokenizer",
            "toy",
            "--max-schemas",
            "8",
            "--calls",
            "64",
            "--warm-up",
            "32",
            "--compile-timeout",
            "5",
            "--cache-mb",
            "4",
            "--cache-count",
            "8",
            "--slow-every",
            "8",
            "--limit-mb",
            "30",
        ]
    )
    out = result.stdout + result.stderr
    summary = re.search(r"(\d+) compiled, (\d+) refused, (\d+) timed out", out)
    assert summary, out[-3000:]
    compiled, _, timed_out = map(int, summary.groups())
    assert compiled >= 32 and timed_out >= 8, summary.group(0)  # the loop really compiled and timed out
    growth = re.search(r"growth after warm-up: ([-+][\d.]+) MB \(limit 30 MB\): (OK|FAIL)", out)
    assert growth, out[-3000:]
    assert result.returncode == 0 and growth.group(2) == "OK", out[-3000:]


CLEAR_SCRIPT = """
import gc, sys, warnings
import psutil
warnings.simplefilter("ignore")
from grammarspec.bench.tasks import read_schema_records
from grammarspec.model.loading import load_tokenizer
from grammars import GrammarError, cache_info, clear_grammar_cache, compile_grammar, grammar_spec

def rss():
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20

backend, count = sys.argv[1], int(sys.argv[2])
tok = load_tokenizer("smollm2-135m")
compile_grammar(grammar_spec(schema={"type": "integer"}), tok, backend=backend)
base = rss()
for record in read_schema_records()[:count]:
    try:  # through the worker process: the grammar comes back serialised
        compile_grammar(grammar_spec(schema=record["schema"]), tok, backend=backend, compile_timeout=60)
    except GrammarError:
        pass
full, held = rss(), cache_info()["grammar_bytes"]
clear_grammar_cache()
print(f"base {base:.1f} full {full:.1f} cleared {rss():.1f} estimated {held / 2**20:.1f}")
"""


@pytest.mark.parametrize("backend, count", [("outlines", 12), ("xgrammar", 41)])
def test_clear_grammar_cache_hands_the_memory_back(backend, count):
    """And the cache's byte estimate is not far below the memory measured (xgrammar's own said a seventh)."""
    result = _run(["-c", CLEAR_SCRIPT, backend, str(count)])
    found = re.search(r"base ([\d.]+) full ([\d.]+) cleared ([\d.]+) estimated ([\d.]+)", result.stdout)
    assert result.returncode == 0 and found, result.stdout + result.stderr[-3000:]
    base, full, cleared, estimated = map(float, found.groups())
    assert full - base >= 10, found.group(0)  # the grammars took real memory
    assert estimated >= 0.5 * (full - base), found.group(0)  # the cache's estimate is not far below it
    assert cleared - base <= 0.25 * (full - base), found.group(0)  # and clearing gave (nearly) all of it back


def test_the_heap_is_trimmed_once_evicted_grammars_are_freed(monkeypatch):
    """glibc keeps freed pages; the caches hand them back (malloc_trim) after evictions, not only on clear."""
    import grammars.compile_cache as compile_cache
    from grammars import clear_grammar_cache, compile_grammar, grammar_spec, set_cache_limits
    from tests.toy import toy_byte_level_tokenizer

    tok = toy_byte_level_tokenizer()
    clear_grammar_cache()  # so that both grammars below are compiled here
    trims: list[int] = []
    monkeypatch.setattr(compile_cache, "_trim_heap", lambda: trims.append(1))
    monkeypatch.setattr(compile_cache, "TRIM_AFTER_SECONDS", float("inf"))  # only freed bytes count here
    monkeypatch.setattr(compile_cache, "TRIM_AFTER_BYTES", 1)
    monkeypatch.setattr(compile_cache, "_freed_since_trim", 0)
    previous = set_cache_limits(grammar_count=1)
    try:
        compile_grammar(grammar_spec(regex="a{11}b"), tok, backend="xgrammar")
        assert not trims
        compile_grammar(grammar_spec(regex="a{12}b"), tok, backend="xgrammar")  # evicts the first
        assert trims, "evicting the first grammar freed it without trimming the heap"
    finally:
        set_cache_limits(grammar_count=previous.grammar_count)
