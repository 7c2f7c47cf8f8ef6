"""The vLLM side of ``grammarspec bench``: run in the vLLM environment, JSON in, JSON out.

    .venv-vllm/bin/python -m grammarspec.bench.vllm_worker JOB.json OUT.json

``JOB.json`` (written by :mod:`grammarspec.bench.vllm_arms`): ``model`` (a local directory), ``arms``,
``num_speculative_tokens``, ``max_tokens``, ``temperature``, ``seed``, ``max_model_len``, ``modes``
(``"batch1"``: one request at a time, per-request latency; ``"all"``: every request submitted at once,
throughput; ``"closed"``: for each of ``levels``, a closed loop of that many requests in flight over the
tasks, throughput) and ``tasks`` (``task``, ``prompt_ids``, ``schema`` or an xgrammar EBNF ``grammar``,
optionally its own ``max_tokens``).  The prompt ids come from the main
environment, so both sides decode from identical prompts.

``OUT.json`` is rewritten after every arm: ``{"arms": {arm: {"batch1": [...], "all": {...}}}, "machine": ...}``.
Per request: ``tokens`` (the stop token included), ``seconds``, ``first_token_seconds``, ``finish_reason``
and, at batch 1, the spec-decode counter deltas (``drafts``, ``draft_tokens``, ``accepted_tokens``).
One engine per arm, started before any timing and warmed up with one short request.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

#: Tokens of the untimed warm-up request of each arm.
WARMUP_TOKENS = 8


def _params(
    sampling_params: Any, structured: Any, task: dict[str, Any], max_tokens: int, temperature: float, seed: int
) -> Any:
    """A task's sampling parameters: its JSON Schema (``schema``), an xgrammar EBNF ``grammar``, or neither."""
    if task.get("grammar"):
        constraint = structured(grammar=task["grammar"])
    elif task.get("schema") is not None:
        constraint = structured(json=task["schema"])
    else:
        constraint = None  # free text (a reply after tool_choice "none")
    return sampling_params(
        temperature=temperature,
        max_tokens=max_tokens,
        seed=seed if temperature > 0 else None,
        structured_outputs=constraint,
    )


def _refusals() -> tuple[type[BaseException], ...]:
    """What vLLM raises for a request it refuses (its client errors, and ValueError in older releases)."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return (ValueError,)
    return (ValueError, VLLMClientError)


def _drive(
    engine: Any, requests: list[tuple[str, list[int], Any]], in_flight: int | None = None
) -> dict[str, dict[str, Any]]:
    """Step the engine until ``requests`` (id, prompt ids, params) all finish, ``in_flight`` at most at once.

    ``None``: all submitted at once.  Otherwise a closed loop: a finished request's place goes to the next
    one.  Per request: ``tokens``, ``finish_reason``, and ``first_token_seconds`` / ``seconds`` from the
    call's start; or ``error`` where vLLM refused the request.
    """
    out: dict[str, dict[str, Any]] = {}
    waiting = list(reversed(requests))
    limit = len(requests) if in_flight is None else max(1, in_flight)
    running = 0
    started = time.perf_counter()
    while waiting or engine.has_unfinished_requests():
        while waiting and running < limit:
            request_id, prompt_ids, params = waiting.pop()
            try:
                engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, params)
            except _refusals() as e:  # vLLM refused it (a schema feature its grammar backend lacks)
                out[request_id] = {"error": f"{type(e).__name__}: {e}"}
                continue
            running += 1
        for output in engine.step():
            now = time.perf_counter() - started
            record = out.setdefault(output.request_id, {"first_token_seconds": None})
            completion = output.outputs[0]
            if record["first_token_seconds"] is None and completion.token_ids:
                record["first_token_seconds"] = now
            if output.finished:
                running -= 1
                record.update(
                    tokens=list(completion.token_ids), seconds=now, finish_reason=completion.finish_reason or "length"
                )
    return out


def run_arm(job: dict[str, Any], arm: str) -> dict[str, Any]:
    """Start one engine for ``arm``, warm it up, run the job's modes; returns that arm's results."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from grammarspec.vllm.engine import make_llm, spec_decode_counts, speculation, suffix_missing

    missing = suffix_missing() if arm == "vllm-suffix" else None
    if missing:
        raise RuntimeError(missing)
    t0 = time.perf_counter()
    llm = make_llm(
        job["model"],
        speculation(arm, job["num_speculative_tokens"]),
        max_model_len=job["max_model_len"],
        seed=job["seed"],
    )
    engine = llm.llm_engine
    result: dict[str, Any] = {"startup_seconds": time.perf_counter() - t0}
    tasks = job["tasks"]

    def params(task: dict[str, Any], max_tokens: int | None = None) -> Any:
        return _params(
            SamplingParams,
            StructuredOutputsParams,
            task,
            max_tokens or task.get("max_tokens") or job["max_tokens"],
            job["temperature"],
            job["seed"],
        )

    _drive(engine, [("warmup", tasks[0]["prompt_ids"], params(tasks[0], WARMUP_TOKENS))])
    if "batch1" in job["modes"]:
        runs = []
        for i, task in enumerate(tasks):
            before = spec_decode_counts(llm)
            record = _drive(engine, [(f"b1-{i}", task["prompt_ids"], params(task))])[f"b1-{i}"]
            after = spec_decode_counts(llm)
            runs.append({"task": task["task"], **record, **{k: after[k] - before[k] for k in after}})
        result["batch1"] = runs
    if "all" in job["modes"]:
        before = spec_decode_counts(llm)
        t1 = time.perf_counter()
        records = _drive(engine, [(f"all-{i}", task["prompt_ids"], params(task)) for i, task in enumerate(tasks)])
        wall = time.perf_counter() - t1
        after = spec_decode_counts(llm)
        result["all"] = {
            "seconds": wall,
            "requests": [{"task": task["task"], **records[f"all-{i}"]} for i, task in enumerate(tasks)],
            **{k: after[k] - before[k] for k in after},
        }
    for level in job.get("levels", []) if "closed" in job["modes"] else []:
        before = spec_decode_counts(llm)
        t1 = time.perf_counter()
        records = _drive(
            engine, [(f"c{level}-{i}", task["prompt_ids"], params(task)) for i, task in enumerate(tasks)], level
        )
        wall = time.perf_counter() - t1
        after = spec_decode_counts(llm)
        done = {task["task"]: records[f"c{level}-{i}"] for i, task in enumerate(tasks)}
        result.setdefault("closed", {})[str(level)] = {
            "seconds": wall,
            "tokens": sum(len(r["tokens"]) for r in done.values() if "error" not in r),
            "outputs": {task: r["tokens"] for task, r in done.items() if "error" not in r},
            "refused": {task: r["error"] for task, r in done.items() if "error" in r},
            **{k: after[k] - before[k] for k in after},
        }
    llm.llm_engine.engine_core.shutdown()
    del llm, engine
    gc.collect()
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m grammarspec.bench.vllm_worker JOB.json OUT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    out_path = Path(args[1])
    import vllm

    results: dict[str, Any] = {
        "vllm": vllm.__version__,
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "load_average_at_start": os.getloadavg()[0],
        "arms": {},
    }
    from grammarspec.vllm.engine import arm_environment

    for arm in job["arms"]:
        saved = dict(os.environ)
        os.environ.update(arm_environment(arm))  # read when the engine builds its proposer
        try:
            results["arms"][arm] = run_arm(job, arm)
        except Exception as e:  # noqa: BLE001 - one arm failing is reported, the others still run
            results["arms"][arm] = {"error": f"{type(e).__name__}: {e}"}
        finally:
            for name in arm_environment(arm):  # the next arm's engine starts under its own settings
                if name in saved:
                    os.environ[name] = saved[name]
                else:
                    os.environ.pop(name, None)
        results["load_average_at_end"] = os.getloadavg()[0]
        out_path.write_text(json.dumps(results) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
