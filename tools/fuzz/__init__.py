"""Fuzz grammarspec over a corpus of production JSON schemas.

    python -m tools.fuzz --schemas /path/to/schemas --out FUZZ.md   # a whole corpus, both backends
    python -m tools.fuzz --per-category 2 --out /tmp/f.md            # a stratified slice of data/schemas

(run from the repository root).  For every record of a schema corpus
(``--schemas DIR``, else ``$GRAMMARSPEC_SCHEMAS``, else the repository's
``data/schemas`` sample; see its README) and every backend, four kinds of check, each ending in one *outcome*:

* ``compile``: the schema compiles (``compiled``), or the backend refuses it
  with a :class:`~grammars.GrammarError` that gives a reason (``unsupported``).
  Any other exception is a bug (``crash``).
* ``example``: each valid example, serialised compactly
  (``json.dumps(x, separators=(",", ":"), ensure_ascii=False)``) and
  tokenized with the model's tokenizer, is accepted token by token and the
  matcher terminates on EOS (``accepted``).  Where the corpus records that
  xgrammar itself rejects the example (``meta.xgrammar_accepts_examples``),
  a rejection is ``rejected_flagged``; outlines-core has no such flags and is
  known to be stricter than the schema in places, so its rejections are
  ``rejected_stricter`` (a completeness gap, never unsafe).
  ``Matcher.validate`` must count the same legal tokens as the walk.
* ``invalid_example``: each invalid example is ``rejected``, or, when every
  violation is of a keyword the backend does not enforce (see
  :data:`~tools.fuzz.enforced.ENFORCED` and :func:`~tools.fuzz.enforced.is_enforced`), ``accepted_unenforced``.
* ``generate``: :func:`grammarspec.complete` with the model, greedy or
  sampled, with a rotating proposer and a short ``max_new_tokens``.  A
  finished output (``stop``) is JSON and validates (``stop_valid``), or its
  every violation is of an unenforced keyword and the completion does not
  claim to be valid (``stop_unenforced``).  An output cut by the token limit
  reports ``length``, has exactly ``max_new_tokens`` tokens and is never
  claimed valid.

Outcomes in :data:`BUG_OUTCOMES` are bugs; the others are expected
behaviour and are counted in the summary.  The CLI runs each (record,
backend) job in a worker process with a timeout (outlines-core can take
minutes on some schemas; ``timeout`` is an outcome, not a crash) and writes
every check to a JSONL file and a markdown summary.  The CI slice
(``tests/grammars/test_fuzz_corpus.py``) runs the same checks in-process.

Developer tooling, not part of the installed package.  Modules:
:mod:`.enforced` (what each backend enforces), :mod:`.corpus` (slices,
prompts), :mod:`.checks` (the checks), :mod:`.runner` (worker processes),
:mod:`.report` (the markdown summary), ``__main__`` (the command line).
"""

from .checks import (
    BUG_OUTCOMES,
    GENERATION_CONFIGS,
    Check,
    FuzzContext,
    GenConfig,
    classify_completion,
    compile_check,
    configs_for,
    fuzz_record,
    generation_checks,
    grammar_checks,
    schema_errors,
    walk,
)
from .corpus import CI_SLICES, QUOTE_LIMIT, Slice, fuzz_prompt, stratified_slice
from .enforced import BACKENDS, ENFORCED, FORMATS, UNENFORCED_CONTEXTS, is_enforced
from .report import read_results, summarize
from .runner import Job, RunOptions, run_isolated

__all__ = [
    "BACKENDS",
    "BUG_OUTCOMES",
    "CI_SLICES",
    "ENFORCED",
    "FORMATS",
    "GENERATION_CONFIGS",
    "QUOTE_LIMIT",
    "UNENFORCED_CONTEXTS",
    "Check",
    "FuzzContext",
    "GenConfig",
    "Job",
    "RunOptions",
    "Slice",
    "classify_completion",
    "compile_check",
    "configs_for",
    "fuzz_prompt",
    "fuzz_record",
    "generation_checks",
    "grammar_checks",
    "is_enforced",
    "read_results",
    "run_isolated",
    "schema_errors",
    "stratified_slice",
    "summarize",
    "walk",
]
