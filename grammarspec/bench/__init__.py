"""``grammarspec bench``: speed and acceptance of every proposer against plain constrained decoding.

The pieces, each with one job: :mod:`.tasks` (inputs), :mod:`.arms` (how
each arm generates, the baseline included), :mod:`.runner` (interleaved
runs), :mod:`.scoring` (pure metrics), :mod:`.report` (JSON and markdown),
:mod:`.plots` (PNGs).  The command line lives in :mod:`grammarspec.cli.main`.
"""

from grammarspec.bench.arms import ARMS, DEFAULT_ARMS, QUICK_ARMS
from grammarspec.bench.report import summarize, to_markdown, write_results
from grammarspec.bench.runner import BenchConfig, BenchResult, run_bench
from grammarspec.bench.tasks import (
    BenchTask,
    TaskFileError,
    default_tasks_path,
    load_schema_corpus,
    load_tasks,
    select_tasks,
)

__all__ = [
    "ARMS",
    "DEFAULT_ARMS",
    "QUICK_ARMS",
    "BenchConfig",
    "BenchResult",
    "BenchTask",
    "TaskFileError",
    "run_bench",
    "summarize",
    "to_markdown",
    "write_results",
    "load_tasks",
    "load_schema_corpus",
    "select_tasks",
    "default_tasks_path",
]
