"""vLLM's arms under load: closed loops of C requests in flight over the task file, the arms interleaved.

Each (round, level) starts one engine per arm in turn -- the arms' order reversed every other round, so a
drift of the machine's speed falls on every arm alike -- and runs the tasks through a closed loop of
``level`` requests in flight (:mod:`grammarspec.bench.vllm_worker`'s ``closed`` mode).  Per arm and level:
output tokens per second, tokens per target pass (tokens - accepted drafts), and each speculating arm's
throughput over ``vllm``'s (no drafts) of the same round; the mean of those per-round ratios is the figure,
their spread its noise.  Outputs are compared with ``vllm``'s, request by request.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from grammarspec.bench.vllm_arms import NUM_SPECULATIVE_TOKENS, launch_worker, vllm_python

__all__ = ["interleaved_order", "run_vllm_load", "load_markdown"]


def interleaved_order(arms: Sequence[str], rounds: int) -> list[tuple[int, list[str]]]:
    """``(round, arms in order)`` per round: the arms forward, then backward, and so on.  Pure.

    >>> interleaved_order(["vllm", "vllm-ngram"], 3)
    [(0, ['vllm', 'vllm-ngram']), (1, ['vllm-ngram', 'vllm']), (2, ['vllm', 'vllm-ngram'])]
    """
    return [(r, list(arms) if r % 2 == 0 else list(reversed(arms))) for r in range(rounds)]


def run_vllm_load(
    tasks: Sequence[dict[str, Any]],
    arms: Sequence[str],
    levels: Sequence[int],
    model_dir: str,
    *,
    rounds: int = 2,
    max_tokens: int = 96,
    max_model_len: int = 2048,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Every arm at every level, ``rounds`` times, interleaved; ``tasks``: ``task``, ``prompt_ids``, ``schema``.

    Returns ``{"runs": [{"round", "level", "arm", ...closed-mode totals or "error"}], "arms", "levels"}``.
    """
    if "vllm" not in arms:
        raise ValueError("the load sweep measures each arm against vllm (no drafts): include the vllm arm")
    python = vllm_python()
    runs: list[dict[str, Any]] = []
    for level in levels:
        for round_, order in interleaved_order(arms, rounds):
            for arm in order:
                job = {
                    "model": model_dir,
                    "arms": [arm],
                    "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
                    "max_tokens": max_tokens,
                    "temperature": 0.0,
                    "seed": 0,
                    "max_model_len": max_model_len,
                    "modes": ["closed"],
                    "levels": [level],
                    "tasks": list(tasks),
                }
                answer = launch_worker(python, job)
                got = answer["arms"].get(arm) or {"error": answer.get("failure", "the vLLM worker returned nothing")}
                closed = got.get("closed", {}).get(str(level))
                run = {"round": round_, "level": level, "arm": arm, "load_average": answer.get("load_average_at_start")}
                runs.append({**run, **closed} if closed else {**run, "error": got.get("error", "no closed run")})
                progress(f"vLLM load: C={level} round {round_} {arm}: " + _brief(runs[-1]))
    return {"runs": runs, "arms": list(arms), "levels": list(levels), "rounds": rounds}


def _brief(run: dict[str, Any]) -> str:
    if "error" in run:
        return f"failed: {run['error'][:200]}"
    return f"{run['tokens'] / run['seconds']:.1f} tok/s" if run["seconds"] else "no time"


def load_markdown(result: dict[str, Any]) -> list[str]:
    """The sweep as a table: per level, each arm's tok/s, tokens per pass and ratio to ``vllm``.  Pure."""
    runs = [r for r in result["runs"] if "error" not in r]
    lines = [
        "| C | arm | tok/s (mean of rounds) | tokens / target pass | x `vllm` (per round) | outputs = `vllm`'s |",
        "|---|---|---|---|---|---|",
    ]
    for level in result["levels"]:
        plain = {r["round"]: r for r in runs if r["level"] == level and r["arm"] == "vllm"}
        for arm in result["arms"]:
            mine = [r for r in runs if r["level"] == level and r["arm"] == arm]
            if not mine:
                lines.append(f"| {level} | `{arm}` | failed | | | |")
                continue
            speeds = [r["tokens"] / r["seconds"] for r in mine if r["seconds"] > 0]
            tokens = sum(r["tokens"] for r in mine)
            passes = sum(r["tokens"] - r.get("accepted_tokens", 0) for r in mine)
            ratios = [
                (r["tokens"] / r["seconds"]) / (plain[r["round"]]["tokens"] / plain[r["round"]]["seconds"])
                for r in mine
                if r["round"] in plain and r["seconds"] > 0 and plain[r["round"]]["seconds"] > 0
            ]
            ratio = (
                f"**{statistics.fmean(ratios):.2f}x** ({', '.join(f'{x:.2f}' for x in ratios)})"
                if ratios and arm != "vllm"
                else "1.00x"
                if arm == "vllm"
                else "-"
            )
            same = _same(plain, mine)
            lines.append(
                f"| {level} | `{arm}` | {statistics.fmean(speeds):.1f} | {tokens / passes if passes else 0:.2f} | "
                f"{ratio} | {same} |"
            )
    refused = {task: error for r in runs for task, error in r.get("refused", {}).items()}
    if refused:
        lines += [
            "",
            f"- vLLM refused {len(refused)} task(s), left out of every arm: {next(iter(refused.values()))[:300]}",
        ]
    failed = [r for r in result["runs"] if "error" in r]
    if failed:
        lines += [
            "",
            *(f"- failed: C={r['level']} round {r['round']} `{r['arm']}`: {r['error'][:300]}" for r in failed),
        ]
    return lines


def _same(plain: dict[int, dict[str, Any]], mine: Sequence[dict[str, Any]]) -> str:
    """``"equal/compared"``: requests whose tokens equal ``vllm``'s of the same round."""
    equal = compared = 0
    for run in mine:
        reference = plain.get(run["round"], {}).get("outputs", {})
        for task, tokens in run.get("outputs", {}).items():
            if task in reference:
                compared += 1
                equal += reference[task] == tokens
    return f"{equal}/{compared}" if compared else "-"
