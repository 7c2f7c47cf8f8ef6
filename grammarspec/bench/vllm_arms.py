"""The vLLM arms of ``grammarspec bench``: vLLM as the peer, run in its own environment.

* ``vllm`` -- vLLM with structured outputs (xgrammar, compact JSON), no speculation;
* ``vllm-ngram`` -- plus vLLM's own n-gram proposer (prompt_lookup_min 2, max 5, like ours);
* ``vllm-suffix`` -- plus vLLM's suffix method (SuffixDecoding; ``make vllm-suffix`` installs it);
* ``vllm-grammarspec`` -- plus grammarspec's drafters (:class:`grammarspec.vllm.GrammarspecProposer`);
* ``vllm-grammarspec-noindex`` -- the same without their index of earlier outputs.

This environment never imports vLLM: the tasks (prompt ids built here, so both sides decode the same
prompts) go to ``python -m grammarspec.bench.vllm_worker`` in ``.venv-vllm`` (``make vllm-env``; another
interpreter via ``GRAMMARSPEC_VLLM_PYTHON``), which answers in JSON.  Two modes per arm: ``batch1`` (one
request at a time: per-request latency, records beside the other arms') and ``all`` (every request
submitted at once: throughput, :attr:`BenchResult.throughput`).  Target passes of a batch-1 request are
``new tokens - accepted draft tokens`` (each vLLM step adds the accepted drafts and one token of its own).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grammarspec.bench.scoring import median, parse_and_validate
from grammarspec.bench.vllm_env import environment, vllm_python
from grammarspec.vllm.engine import ARM_SPECULATION

__all__ = [
    "VLLM_ARMS",
    "NUM_SPECULATIVE_TOKENS",
    "vllm_python",
    "run_vllm_arms",
    "launch_worker",
    "collect",
    "vllm_markdown",
]

VLLM_ARMS = ARM_SPECULATION
#: Draft tokens per step for both speculating vLLM arms.
NUM_SPECULATIVE_TOKENS = 8
#: Seconds a vLLM worker may run per arm of its job (engines on a loaded 2-core machine start in minutes).
TIMEOUT_SECONDS = 3600


def run_vllm_arms(
    prepared: Sequence[tuple[Any, Any]],
    arms: Sequence[str],
    config: Any,
    tokenizer: Any,
    model_dir: str,
    *,
    modes: Sequence[str] = ("batch1", "all"),
    max_model_len: int = 2048,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(records, throughput)`` of the vLLM ``arms`` on ``prepared`` (``(BenchTask, PreparedTask)`` pairs).

    ``records``: one per task and arm at batch 1, in the runner's record format (``repeat`` 0); an arm that
    failed gives error records.  ``throughput``: per arm, the ``all`` mode's totals.  Raises ``ValueError``
    without a vLLM environment.
    """
    python = vllm_python()
    job = {
        "model": model_dir,
        "arms": list(arms),
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        "max_tokens": config.max_new_tokens,
        "temperature": config.temperature,
        "seed": config.seed,
        "max_model_len": max_model_len,
        "modes": list(modes),
        "tasks": [{"task": t.id, "prompt_ids": list(p.prompt_ids), "schema": p.schema} for t, p in prepared],
    }
    answer = launch_worker(python, job)
    return collect(answer, prepared, arms, config, tokenizer)


def launch_worker(python: Path, job: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """Run the worker on ``job``; its answer (``{"arms": {}}`` plus a reason when it wrote nothing).

    ``timeout``: seconds for the whole job (default: :data:`TIMEOUT_SECONDS` per arm).  A worker that
    runs past it is stopped; the arms it finished are kept (it rewrites its answer after each arm) and
    the answer's ``failure`` says so.
    """
    limit = timeout if timeout is not None else TIMEOUT_SECONDS * max(1, len(job["arms"]))
    with tempfile.TemporaryDirectory(prefix="grammarspec-vllm-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        command = [str(python), "-m", "grammarspec.bench.vllm_worker", str(job_path), str(out_path)]
        # its own session, so a worker stopped at the limit takes vLLM's engine processes with it
        proc = subprocess.Popen(
            command,
            env=environment(python),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=limit)
            status, tail = proc.returncode, (stderr or stdout or "").strip()[-1500:]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            status, tail = None, ""
        answer = json.loads(out_path.read_text(encoding="utf-8")) if out_path.is_file() else {"arms": {}}
    if status is None:
        print(f"grammarspec bench: the vLLM worker ran past {limit:.0f} s and was stopped", file=sys.stderr)
        answer["failure"] = f"the vLLM worker ran past {limit:.0f} s and was stopped before this arm finished"
    elif status != 0:
        print(f"grammarspec bench: the vLLM worker exited with status {status}:\n{tail}", file=sys.stderr)
        answer["failure"] = f"the vLLM worker exited with status {status}"
    return answer


def collect(
    answer: dict[str, Any], prepared: Sequence[tuple[Any, Any]], arms: Sequence[str], config: Any, tokenizer: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The worker's ``answer`` as bench records (batch 1) and the throughput summary (``all``).  Pure."""
    records: list[dict[str, Any]] = []
    throughput: dict[str, Any] = {
        "vllm": answer.get("vllm"),
        "ld_preload": answer.get("ld_preload"),
        "load_average": [answer.get("load_average_at_start"), answer.get("load_average_at_end")],
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        "arms": {},
    }
    for arm in arms:
        got = answer["arms"].get(arm) or {"error": answer.get("failure", "the vLLM worker returned nothing")}
        runs = {r["task"]: r for r in got.get("batch1", [])}
        for task, prep in prepared:
            run = runs.get(task.id)
            if run is None or "error" in run:  # the arm failed, or vLLM refused this request
                base = {"task": task.id, "category": task.category, "arm": arm, "repeat": 0}
                records.append({**base, "error": (run or got).get("error", "no batch-1 run")})
            else:
                records.append(_record(task, prep, arm, run, tokenizer, config))
        if "all" in got:
            throughput["arms"][arm] = _throughput(got["all"], {t.id: t for t, _ in prepared}, tokenizer)
            throughput["arms"][arm]["startup_seconds"] = got.get("startup_seconds")
    return records, throughput


def _record(task: Any, prep: Any, arm: str, run: dict[str, Any], tokenizer: Any, config: Any) -> dict[str, Any]:
    from grammarspec.bench.arms import RunResult
    from grammarspec.bench.records import make_record

    finish = "stop" if run["finish_reason"] == "stop" else "length"
    result = RunResult(
        tokens=run["tokens"],
        seconds=run["seconds"],
        finish_reason=finish,
        first_step_seconds=run.get("first_token_seconds") or 0.0,
        first_step_tokens=1,
    )
    record = make_record(task, prep, arm, 0, tokenizer, result)
    accepted = int(run.get("accepted_tokens", 0))
    record.update(
        target_forwards=max(1, record["new_tokens"] - accepted),
        proposed={arm: int(run.get("draft_tokens", 0))} if arm != "vllm" else {},
        accepted={arm: accepted} if arm != "vllm" else {},
        drafts=int(run.get("drafts", 0)),
    )
    return record


def _throughput(all_mode: dict[str, Any], tasks: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    requests = [r for r in all_mode["requests"] if "error" not in r]  # not those vLLM refused
    new = sum(len(r["tokens"]) for r in requests)
    valid = 0
    for r in requests:
        eos = tokenizer.eos_token_id
        text = tokenizer.decode([t for t in r["tokens"] if t != eos], skip_special_tokens=True)
        valid += parse_and_validate(text, tasks[r["task"]].schema, r["finish_reason"] == "stop")[1]
    accepted = all_mode.get("accepted_tokens", 0)
    return {
        "requests": len(requests),
        "new_tokens": new,
        "seconds": all_mode["seconds"],
        "tokens_per_second": new / all_mode["seconds"] if all_mode["seconds"] else None,
        "tokens_per_target_pass": new / (new - accepted) if new > accepted else None,
        "acceptance": accepted / all_mode["draft_tokens"] if all_mode.get("draft_tokens") else None,
        "valid": valid / len(requests) if requests else None,
        "tokens": {r["task"]: r["tokens"] for r in requests},
    }


# --- markdown ---------------------------------------------------------------------------------


def _f(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def vllm_markdown(runs: Sequence[dict[str, Any]], throughput: dict[str, Any]) -> list[str]:
    """The vLLM sections of the report (``[]`` without vLLM runs).  Pure."""
    good = [r for r in runs if "error" not in r]
    arms = [a for a in VLLM_ARMS if any(r["arm"] == a for r in good)]
    if not arms:
        return []
    categories = list(dict.fromkeys(r["category"] for r in good)) + ["all"]

    def pick(arm: str, category: str) -> list[dict[str, Any]]:
        return [r for r in good if r["arm"] == arm and category in ("all", r["category"])]

    lines = [
        "",
        "### Inside vLLM, batch 1: tokens per target pass (accepted draft tokens per pass)",
        "",
        (
            f"vLLM {throughput.get('vllm')}, {throughput.get('num_speculative_tokens')} draft tokens per step; "
            "target passes = new tokens - accepted draft tokens (vLLM's spec-decode counters)."
        ),
        "",
    ]
    spec_arms = [a for a in arms if a != "vllm"]
    ratio = "vllm-ngram" in spec_arms and "vllm-grammarspec" in spec_arms
    lines += [
        "| category | " + " | ".join(spec_arms) + (" | grammarspec / ngram |" if ratio else " |"),
        "|---|" + "---:|" * (len(spec_arms) + ratio),
    ]
    for category in categories:
        cells, per_pass = [], {}
        for arm in spec_arms:
            rs = pick(arm, category)
            new, passes = sum(r["new_tokens"] for r in rs), sum(r["target_forwards"] for r in rs)
            accepted = sum(sum(r["accepted"].values()) for r in rs)
            per_pass[arm] = accepted / passes if passes else None
            cells.append(f"{_f(new / passes if passes else None)} ({_f(per_pass[arm])})")
        if ratio:
            a, b = per_pass["vllm-grammarspec"], per_pass["vllm-ngram"]
            cells.append(_f(a / b if a is not None and b else None, ".2f", "x"))
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    plain = {r["task"]: r["tokens"] for r in good if r["arm"] == "vllm"}
    if plain and spec_arms:
        same = []
        for arm in spec_arms:
            rs = [r for r in good if r["arm"] == arm and r["task"] in plain]
            same.append(f"{arm} {sum(r['tokens'] == plain[r['task']] for r in rs)}/{len(rs)}")
        lines += [
            "",
            "Batch-1 outputs token-for-token identical to the `vllm` arm (no speculation): " + ", ".join(same) + ".",
        ]
    hf = [a for a in ("baseline", "auto") if any(r["arm"] == a for r in good)]
    shown = hf + arms
    latency_ratio = "auto" in hf and "vllm-ngram" in arms
    lines += [
        "",
        "### Batch 1: median per-request latency (seconds)",
        "",
        (
            "Same prompts, grammar (compact JSON) and greedy settings; `auto` is grammarspec on Hugging Face. "
            "Ratio: vllm-ngram's latency over auto's, per task, median per category (above 1: grammarspec faster)."
        ),
        "",
        "| category | " + " | ".join(shown) + (" | vllm-ngram / auto |" if latency_ratio else " |"),
        "|---|" + "---:|" * (len(shown) + latency_ratio),
    ]
    for category in categories:
        cells = [_f(median(r["seconds"] for r in pick(arm, category))) for arm in shown]
        if latency_ratio:
            ours = {r["task"]: r["seconds"] for r in pick("auto", category)}
            ratios = [r["seconds"] / ours[r["task"]] for r in pick("vllm-ngram", category) if ours.get(r["task"])]
            cells.append(_f(median(ratios), ".2f", "x"))
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    per_arm = throughput.get("arms", {})
    if per_arm:
        lines += [
            "",
            "### All requests submitted at once: throughput",
            "",
            "| arm | requests | new tokens | seconds | tok/s | tok/pass | acceptance | valid |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for arm in VLLM_ARMS:
            t = per_arm.get(arm)
            if t:
                lines.append(
                    f"| {arm} | {t['requests']} | {t['new_tokens']} | {_f(t['seconds'], '.1f')} "
                    f"| {_f(t['tokens_per_second'], '.1f')} | {_f(t['tokens_per_target_pass'])} "
                    f"| {_f(t['acceptance'], '.0%')} | {_f(t['valid'], '.0%')} |"
                )
        if per_arm.get("vllm-ngram") and per_arm.get("vllm-grammarspec"):
            a, b = per_arm["vllm-grammarspec"]["tokens_per_second"], per_arm["vllm-ngram"]["tokens_per_second"]
            lines += ["", f"vllm-grammarspec / vllm-ngram throughput: {_f(a / b if a and b else None, '.2f', 'x')}."]
    return lines
