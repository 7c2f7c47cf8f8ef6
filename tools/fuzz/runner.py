"""The corpus run: every (record, backend) job in a worker process, with timeouts.

outlines-core can take minutes on some schemas, so a job that passes its
compile or job timeout becomes a ``timeout`` check and its worker is
replaced; a worker that dies becomes a ``crash`` check.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .checks import Check, FuzzContext, configs_for, generation_checks, grammar_checks

__all__ = ["Job", "RunOptions", "run_isolated"]


@dataclass(frozen=True)
class Job:
    """One record with one backend; ``generations`` settings from the rotation at ``index``."""

    record: dict[str, Any]
    backend: str
    index: int = 0
    generations: int = 0


@dataclass(frozen=True)
class RunOptions:
    model: str = "smollm2-135m"
    max_new_tokens: int = 32
    seed: int = 0
    compile_timeout: float = 180.0
    job_timeout: float = 900.0
    threads: int = 0  # torch threads in the worker (0: torch's default)


def _worker_main(conn: Any, options: RunOptions) -> None:
    """Worker process: load the tokenizer (the model on first need), then run jobs."""
    import torch

    if options.threads:
        torch.set_num_threads(options.threads)
    from grammarspec.model.loading import load_model, load_tokenizer

    ctx = FuzzContext.create(load_tokenizer(options.model))
    conn.send(("ready", None))
    while True:
        job = conn.recv()
        if job is None:
            return
        checks = grammar_checks(ctx, job.record, job.backend)
        conn.send(("checks", [asdict(c) for c in checks]))
        if job.generations and checks[0].outcome == "compiled":
            if ctx.model is None:
                model, tokenizer = load_model(options.model)
                ctx = FuzzContext.create(tokenizer, model)
            gen = generation_checks(
                ctx,
                job.record,
                job.backend,
                configs_for(job.index, job.generations),
                max_new_tokens=options.max_new_tokens,
                seed=options.seed,
            )
            conn.send(("checks", [asdict(c) for c in gen]))
        conn.send(("done", None))


class _Worker:
    """One worker process; replaced when a job times out or the process dies."""

    def __init__(self, options: RunOptions) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, options), daemon=True)
        self.process.start()
        child.close()
        if not self.conn.poll(900):
            self.stop()
            raise RuntimeError("the fuzz worker did not start within 900 s")
        self.conn.recv()

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(30)
        self.stop()


def run_isolated(jobs: Sequence[Job], options: RunOptions, on_checks: Any = None) -> list[Check]:
    """Run jobs in a worker process, with timeouts; returns every check.

    The compile step of a job must finish within ``options.compile_timeout``
    and the whole job within ``options.job_timeout``; otherwise the job gets a
    ``timeout`` check and the worker is replaced.  A worker that dies gets a
    ``crash`` check.  ``on_checks(list[Check])`` sees checks as they arrive.
    """
    results: list[Check] = []
    worker: _Worker | None = None

    def emit(checks: list[Check]) -> None:
        results.extend(checks)
        if on_checks is not None:
            on_checks(checks)

    try:
        for job in jobs:
            if worker is None:
                worker = _Worker(options)
            worker.conn.send(job)
            started = time.monotonic()
            deadline = started + options.compile_timeout
            compiled = False
            while True:
                try:
                    ready = worker.conn.poll(max(0.0, deadline - time.monotonic()))
                    message = worker.conn.recv() if ready else ("timeout", None)
                except (EOFError, OSError):
                    message = ("died", None)
                if message[0] in ("timeout", "died"):
                    phase = "generate" if compiled else "compile"
                    if message[0] == "timeout":
                        limit = options.job_timeout if compiled else options.compile_timeout
                        outcome, why = "timeout", f"{phase} did not finish within {limit:.0f} s"
                    else:
                        outcome = "crash"
                        why = f"the worker process died during {phase} (exit code {worker.process.exitcode})"
                    record = job.record
                    emit(
                        [
                            Check(
                                record["id"],
                                record["category"],
                                job.backend,
                                phase,
                                outcome,
                                why,
                                time.monotonic() - started,
                            )
                        ]
                    )
                    worker.stop()
                    worker = None
                    break
                kind, payload = message
                if kind == "checks":
                    if not compiled:
                        compiled = True
                        deadline = started + options.job_timeout
                    emit([Check(**c) for c in payload])
                elif kind == "done":
                    break
    finally:
        if worker is not None:
            worker.close()
    return results
