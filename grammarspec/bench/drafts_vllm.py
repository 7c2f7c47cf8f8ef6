"""The vLLM arms of ``bench-serve --drafts``: the same requests through vLLM, one at a time.

vLLM learns across requests in its ``suffix`` method (a global tree of earlier outputs) and in grammarspec's
proposer (its index of earlier outputs); one engine per arm serves the whole workload in order, so each sees
the earlier requests of its own run, as a server would.  The prompts are rendered here exactly as
``grammarspec serve`` renders them (:func:`grammarspec.conversation.prompt_ids`) and decoded under the same
schema (vLLM's xgrammar structured outputs, compact JSON), greedy.  Per arm: completion tokens, target passes
(each vLLM step adds its accepted drafts and one token of its own, so passes are tokens - accepted drafts),
draft tokens proposed and accepted, and tokens per second over the requests' own times.

The ``agent`` workload is replayed: each model turn the server answered is sent again with the conversation
as it stood in the server's run (tools described, ``tool_choice`` applied, the same call constraint: a JSON
Schema, the xgrammar EBNF of a call-or-text reply, or none for ``tool_choice="none"``), so every arm decodes
the same turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grammarspec.bench.records import rates
from grammarspec.bench.vllm_arms import NUM_SPECULATIVE_TOKENS, VLLM_ARMS, launch_worker, vllm_python

__all__ = ["vllm_repeat", "vllm_agent", "agent_tasks", "vllm_totals"]


def vllm_repeat(
    tokenizer: Any,
    requests: Sequence[dict[str, Any]],
    arms: Sequence[str],
    model_dir: str,
    *,
    max_model_len: int = 2048,
) -> dict[str, dict[str, Any]]:
    """Per vLLM arm, the totals of ``requests`` (the ``repeat`` workload's) sent one at a time, in order.

    An arm that failed (vLLM's suffix method without arctic-inference, say) holds ``error``.  Raises
    ``ValueError`` for an arm that is not a vLLM arm or without the vLLM environment.
    """
    from grammarspec.conversation import prompt_ids
    from grammarspec.tool_calls import tool_format_for

    tool_format = tool_format_for(tokenizer, "auto")
    tasks = [
        {
            "task": r["id"],
            "prompt_ids": prompt_ids(tokenizer, r["messages"], None, tool_format),
            "schema": r["schema"],
            "max_tokens": int(r["max_tokens"]),
        }
        for r in requests
    ]
    return _run(arms, tasks, model_dir, max_model_len)


def vllm_agent(
    tokenizer: Any, turns: Sequence[dict[str, Any]], arms: Sequence[str], model_dir: str, *, max_model_len: int = 2048
) -> dict[str, dict[str, Any]]:
    """Per vLLM arm, the totals of the server's agent ``turns`` (its records: ``id``, ``messages``,
    ``tool_choice``, ``max_tokens``) replayed one at a time, in order.  Raises ``ValueError`` as
    :func:`vllm_repeat`."""
    return _run(arms, agent_tasks(tokenizer, turns), model_dir, max_model_len)


def agent_tasks(tokenizer: Any, turns: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The worker's tasks for the server's agent ``turns``: prompt ids and constraint as the server built them.

    Each turn keeps its own ``max_tokens``.  Pure.
    """
    from grammarspec.bench.agent_tasks import TOOLS
    from grammarspec.constraint import Constraint
    from grammarspec.conversation import prompt_ids
    from grammarspec.tool_calls import tool_format_for

    tool_format = tool_format_for(tokenizer, "auto")
    tasks = []
    for turn in turns:
        choice = turn["tool_choice"]
        (spec,) = Constraint(tools=TOOLS, tool_choice=choice, tool_format=tool_format).resolve().specs(1)
        task: dict[str, Any] = {
            "task": turn["id"],
            "prompt_ids": prompt_ids(tokenizer, turn["messages"], TOOLS, tool_format, choice),
            "max_tokens": turn["max_tokens"],
        }
        if spec is not None and spec.schema is not None:
            task["schema"] = spec.schema
        elif spec is not None:
            task["grammar"] = spec.source
        tasks.append(task)
    return tasks


def _run(
    arms: Sequence[str], tasks: list[dict[str, Any]], model_dir: str, max_model_len: int
) -> dict[str, dict[str, Any]]:
    """``tasks`` one at a time through one engine per vLLM arm, in order; each arm's totals."""
    unknown = [arm for arm in arms if arm not in VLLM_ARMS]
    if unknown:
        raise ValueError(f"unknown vLLM arm {', '.join(unknown)}; choose from {', '.join(VLLM_ARMS)}")
    job = {
        "model": model_dir,
        "arms": list(arms),
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
        "max_tokens": max(t["max_tokens"] for t in tasks),
        "temperature": 0.0,
        "seed": 0,
        "max_model_len": max_model_len,
        "modes": ["batch1"],
        "tasks": tasks,
    }
    answer = launch_worker(vllm_python(), job)
    out: dict[str, dict[str, Any]] = {}
    for arm in arms:
        got = answer["arms"].get(arm) or {"error": answer.get("failure", "the vLLM worker returned nothing")}
        out[arm] = {"error": got["error"]} if "error" in got else vllm_totals(got["batch1"])
    return out


def vllm_totals(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One arm's batch-1 runs (the worker's records) summed; those vLLM refused (``error``) listed apart.  Pure.

    >>> runs = [{"task": "a", "tokens": [5, 6, 2], "seconds": 0.5, "draft_tokens": 4, "accepted_tokens": 1}]
    >>> t = vllm_totals(runs)
    >>> t["tokens"], t["passes"], t["accepted"], t["outputs"]
    (3, 2, 1, {'a': [5, 6, 2]})
    """
    refused = [r for r in runs if "error" in r]
    runs = [r for r in runs if "error" not in r]
    tokens = sum(len(r["tokens"]) for r in runs)
    accepted = sum(int(r.get("accepted_tokens", 0)) for r in runs)
    passes = sum(max(1, len(r["tokens"]) - int(r.get("accepted_tokens", 0))) for r in runs)
    seconds = sum(float(r["seconds"]) for r in runs)
    return {
        **rates(len(runs), tokens, passes, seconds),
        "proposed": sum(int(r.get("draft_tokens", 0)) for r in runs),
        "accepted": accepted,
        "outputs": {r["task"]: list(r["tokens"]) for r in runs},  # the stop token kept, as the server's
        "refused": {r["task"]: r["error"] for r in refused},
    }
