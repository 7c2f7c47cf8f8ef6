"""``grammarspec bench-serve --drafts WORKLOAD``: what drafting from earlier outputs brings a server.

Two workloads of repeated structured traffic, each run through the server's
engine three times -- plain decoding (``none``: every request with the
``"assistant": "none"`` preset), and ``auto`` drafting with the index of
earlier outputs off (``--draft-memory-mb 0``) and on (its default) -- with
everything else the same (greedy, the profiled step cost, so the draft
lengths do not follow the clock):

* ``repeat``: every schema of the task file sent ``repeat`` times with
  different inputs (schema ``i``'s prompt is task ``i``'s instruction and
  schema over another task's document: the same extraction over other
  documents), interleaved round-robin over the schemas and sent by
  ``concurrency`` clients at once;
* ``agent``: the agent benchmark's conversations (:mod:`grammarspec.bench.agent_tasks`),
  ``concurrency`` at once, each turn sent with the whole conversation so far
  (the prefix cache reuses its KV), the tools run in Python.

Each request's own wall time is kept, and its round: 0 for the first request
of its schema (``repeat``) or turn of its conversation (``agent``), the
*cold* ones; the later ones are *warm*.  Per arm: requests, completion
tokens, target passes, tokens per target pass, draft tokens proposed and
accepted per source, tokens per second (only meaningful on a quiet machine;
the counts are load-independent), and each drafting arm over ``none`` in
tokens per second and per target pass, over all requests and the warm ones
(:mod:`grammarspec.bench.drafts_report`).  Every arm's outputs are compared
with the first arm's, request by request: they must be equal.  Before the
arms, the workload's first request goes through a throwaway engine, untimed,
drafting: no arm's first request pays for the model's first passes or for
profiling the pass cost.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from grammarspec.bench.drafts_report import (
    arm_totals,
    drafts_markdown,
    ratios_over,
    replay_arm,
    same_outputs,
    split_totals,
)

__all__ = ["DRAFT_WORKLOADS", "SERVER_ARMS", "repeat_requests", "run_drafts_bench", "drafts_markdown"]

DRAFT_WORKLOADS = ("repeat", "agent")
#: The server's engine: plain decoding (every request ``"assistant": "none"``), then ``auto`` drafting with its
#: index of earlier outputs off (``--draft-memory-mb 0``) and on.
SERVER_ARMS = ("none", "off", "on")


def repeat_requests(tasks: Sequence[Any], repeat: int, max_tokens: int) -> list[dict[str, Any]]:
    """The ``repeat`` workload: ``repeat`` requests per schema, round-robin over the schemas.  Pure.

    Schema ``i``'s ``r``-th request sends task ``(i + r)``'s user message (counted
    within ``i``'s category) under task ``i``'s system message, the sentence that
    describes its schema or tools (as ``bench-serve --sweep``'s ``json`` workload
    sends them) and its schema as the constraint; ``r = 0`` is task ``i`` itself.
    """
    from grammarspec.completion import describe_schema

    schema_tasks = [t for t in tasks if t.schema]
    by_category: dict[str, list[Any]] = {}
    for task in schema_tasks:
        by_category.setdefault(task.category, []).append(task)
    out: list[dict[str, Any]] = []
    for r in range(repeat):
        for task in schema_tasks:
            peers = by_category[task.category]
            source = peers[(peers.index(task) + r) % len(peers)]
            messages = (
                [{"role": "user", "content": source.prompt}]
                if isinstance(source.prompt, str)
                else [dict(m) for m in source.prompt if m.get("role") != "system"]
            )
            extra = describe_schema(task.schema if task.describe_schema else None, task.tools)
            system = "\n\n".join(part for part in (task.system, extra) if part)
            if system:
                messages.insert(0, {"role": "system", "content": system})
            out.append(
                {
                    "id": f"{task.id}#{r}",
                    "round": r,
                    "messages": messages,
                    "schema": task.schema,
                    "max_tokens": max_tokens,
                }
            )
    return out


def _ask(engine: Any, request: Any, name: str, round_: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Submit ``request`` to ``engine`` and wait for its one choice: ``(record, message)``, the record
    (:mod:`grammarspec.bench.drafts_report`) named ``name`` with the request's wall seconds and ``round_``."""
    events: queue.Queue = queue.Queue()
    started = time.perf_counter()
    job = engine.prepare(request, events.put)
    engine.submit(job)
    while True:
        kind, payload = events.get(timeout=3600)
        if kind == "choice":
            seconds = time.perf_counter() - started
            choice, message, _finish = payload
            break
        if kind == "error":
            raise RuntimeError(f"the engine failed a request: {payload}")
    stats = choice.row.stats
    record = {
        "id": name,
        "round": round_,
        "seconds": seconds,
        "tokens": len(choice.tokens),
        "target_forwards": stats.target_forwards,
        "forced_tokens": stats.forced_tokens,  # committed without a pass: plain decoding passes the rest, one each
        "proposed": dict(stats.proposed),
        "accepted": dict(stats.accepted),
        "output": list(choice.tokens),
    }
    return record, message


def _run_repeat(engine: Any, requests: list[dict[str, Any]], concurrency: int, assistant: str) -> list[dict[str, Any]]:
    from grammarspec.serve.protocol import ChatRequest

    records: list[dict[str, Any] | None] = [None] * len(requests)
    todo: queue.Queue = queue.Queue()
    for i in range(len(requests)):
        todo.put(i)

    def client() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            body = requests[i]
            request = ChatRequest(
                messages=body["messages"],
                schema=body["schema"],
                temperature=0.0,
                max_tokens=body["max_tokens"],
                assistant=assistant,
            )
            records[i], _ = _ask(engine, request, body["id"], body["round"])

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in records if r is not None]


def _run_agent(
    engine: Any, conversations: dict[str, list[Any]], concurrency: int, assistant: str
) -> list[dict[str, Any]]:
    from grammarspec.bench.agent_tasks import SYSTEM, TOOLS, ModelTurn, run_tool
    from grammarspec.serve.protocol import ChatRequest

    names = [list(conversations)[j % len(conversations)] for j in range(max(concurrency, len(conversations)))]
    records: list[list[dict[str, Any]]] = [[] for _ in names]

    def play(j: int) -> None:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        turn = 0
        for step in conversations[names[j]]:
            if isinstance(step, str):
                messages.append({"role": "user", "content": step})
                continue
            assert isinstance(step, ModelTurn)
            sent = [dict(m) for m in messages]
            request = ChatRequest(
                messages=sent,
                tools=TOOLS,
                tool_choice=step.tool_choice,
                temperature=0.0,
                max_tokens=step.max_new_tokens,
                assistant=assistant,
            )
            record, message = _ask(engine, request, f"{names[j]}#{j}/{turn}", turn)
            asked = {"messages": sent, "tool_choice": step.tool_choice, "max_tokens": step.max_new_tokens}
            records[j].append({**record, **asked})
            turn += 1
            messages.append(message)
            for call in message.get("tool_calls") or []:
                try:
                    result = run_tool(call["function"]["name"], json.loads(call["function"]["arguments"]))
                except ValueError:
                    result = {"error": "invalid arguments"}
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})

    threads = [threading.Thread(target=play, args=(j,)) for j in range(len(names))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for conversation in records for r in conversation]


def _first_turn(conversations: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The first conversation up to its first model turn.  Pure."""
    from grammarspec.bench.agent_tasks import ModelTurn

    name, script = next(iter(conversations.items()))
    end = next(i for i, step in enumerate(script) if isinstance(step, ModelTurn))
    return {name: script[: end + 1]}


def run_drafts_bench(
    model: torch.nn.Module,
    tokenizer: Any,
    workload: str,
    *,
    concurrency: int = 4,
    repeat: int = 3,
    max_tokens: int = 96,
    draft_memory_mb: float = 256.0,
    tasks_path: str | None = None,
    tasks: Sequence[Any] | None = None,
    conversations: dict[str, list[Any]] | None = None,
    arms: Sequence[str] = SERVER_ARMS,
    model_dir: str | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """``workload`` through a fresh engine per arm (plain decoding, drafts from earlier outputs ``off`` and ``on``).

    ``tasks``: the tasks of ``repeat`` (default: the task file at ``tasks_path``);
    ``conversations``: the scripts of ``agent`` (default: all of them).  ``arms``: ``none``, ``off`` and ``on``
    (the server's engine, run in that order) and vLLM arms (:data:`grammarspec.bench.vllm_arms.VLLM_ARMS`, one
    request at a time, with the model at ``model_dir``; ``agent`` replays the server's turns of
    :func:`~grammarspec.bench.drafts_report.replay_arm`: :mod:`grammarspec.bench.drafts_vllm`).
    """
    from grammarspec.bench.vllm_arms import VLLM_ARMS
    from grammarspec.serve.engine import Engine

    if workload not in DRAFT_WORKLOADS:
        raise ValueError(f"unknown drafts workload {workload!r}; choose from {', '.join(DRAFT_WORKLOADS)}")
    unknown = [arm for arm in arms if arm not in SERVER_ARMS + VLLM_ARMS]
    if unknown:
        raise ValueError(f"unknown arm {', '.join(unknown)}; choose from {', '.join(SERVER_ARMS + VLLM_ARMS)}")
    vllm_arms = [arm for arm in arms if arm in VLLM_ARMS]
    if vllm_arms and model_dir is None:
        raise ValueError("the vLLM arms need the model's directory (model_dir)")
    if vllm_arms and workload == "agent" and not set(arms) & set(SERVER_ARMS):
        raise ValueError("the vLLM arms replay the server's agent turns: add a server arm (none, off or on)")
    if workload == "repeat":
        from grammarspec.bench.tasks import load_tasks

        requests = repeat_requests(tasks if tasks is not None else load_tasks(tasks_path), repeat, max_tokens)
        if not requests:
            raise ValueError("no task has a schema: the repeat workload sends each task's schema")
    else:
        from grammarspec.bench.agent_tasks import CONVERSATIONS

        chosen = conversations if conversations is not None else CONVERSATIONS
    # none: the server as it runs by default, each request asking for plain decoding (it never reads the index)
    settings = {"none": (draft_memory_mb, "none"), "off": (0.0, "auto"), "on": (draft_memory_mb, "auto")}

    def run_arm(megabytes: float, assistant: str, warm_up: bool = False) -> tuple[list[dict[str, Any]], float, Any]:
        """The workload through a fresh engine: ``(records, seconds, index)``; ``warm_up``: its first request."""
        engine = Engine(
            model,
            tokenizer,
            max_batch_size=concurrency,
            max_tokens=max(max_tokens, 256),
            prefix_cache_bytes=(1 << 30) if workload == "agent" else 0,
            step_cost="profile",
            draft_memory_bytes=int(megabytes * (1 << 20)),
        )
        try:
            started = time.perf_counter()
            if workload == "repeat":
                records = _run_repeat(engine, requests[:1] if warm_up else requests, concurrency, assistant)
            else:
                records = _run_agent(engine, _first_turn(chosen) if warm_up else chosen, concurrency, assistant)
            seconds = time.perf_counter() - started
            return records, seconds, engine.drafts.as_dict() if engine.drafts is not None else None
        finally:
            engine.close()

    results: dict[str, Any] = {}
    server_arms = [arm for arm in SERVER_ARMS if arm in arms]
    if server_arms:  # untimed: the first arm would pay the model's first passes, the first drafting one the profile
        run_arm(0.0, "auto", warm_up=True)
    for arm in server_arms:
        records, seconds, index = run_arm(*settings[arm])
        data = {"seconds": seconds, "records": records, "index": index, **arm_totals(records, seconds)}
        data["splits"] = split_totals(records)
        if results:  # greedy: every arm's outputs are the first arm's
            data["identical"] = same_outputs(next(iter(results.values()))["records"], records)
        results[arm] = data
        progress(f"{workload} {arm}: {data['tokens_per_pass']:.3f} tokens/pass, {data['passes']} passes")
    compared = [data["identical"] for data in results.values() if "identical" in data]
    result = {
        "workload": workload,
        "concurrency": concurrency,
        "repeat": repeat,
        "arms": results,
        "ratios": ratios_over({arm: data["splits"] for arm, data in results.items()}),
        "identical": (sum(equal for equal, _ in compared), sum(n for _, n in compared)),
    }
    if vllm_arms:
        from grammarspec.bench.drafts_vllm import vllm_agent, vllm_repeat

        assert model_dir is not None
        if workload == "repeat":
            result["vllm"] = vllm_repeat(tokenizer, requests, vllm_arms, model_dir)
        else:
            turns = results[replay_arm(list(results))]["records"]
            result["vllm"] = vllm_agent(tokenizer, turns, vllm_arms, model_dir)
        progress(f"{workload} vLLM arms: {', '.join(vllm_arms)} done")
    return result
