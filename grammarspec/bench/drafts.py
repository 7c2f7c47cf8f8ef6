"""``grammarspec bench-serve --drafts WORKLOAD``: what drafting from earlier outputs brings a server, on and off.

Two workloads of repeated structured traffic, each run through the server's
engine twice -- the index of earlier outputs on (``--draft-memory-mb``'s
default) and off (0) -- with everything else the same (greedy, the profiled
step cost, so the draft lengths do not follow the clock):

* ``repeat``: every schema of the task file sent ``repeat`` times with
  different inputs (schema ``i``'s prompt is task ``i``'s instruction and
  schema over another task's document: the same extraction over other
  documents), interleaved round-robin over the schemas and sent by
  ``concurrency`` clients at once;
* ``agent``: the agent benchmark's conversations (:mod:`grammarspec.bench.agent_tasks`),
  ``concurrency`` at once, each turn sent with the whole conversation so far
  (the prefix cache reuses its KV), the tools run in Python.

Per arm: requests, completion tokens, target passes, tokens per target pass,
draft tokens proposed and accepted per source, and tokens per second (only
meaningful on a quiet machine; the counts are load-independent).  The outputs
of the two arms are compared request by request: they must be equal.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from grammarspec.bench.records import rates, source_totals

__all__ = ["DRAFT_WORKLOADS", "SERVER_ARMS", "repeat_requests", "run_drafts_bench", "drafts_markdown"]

DRAFT_WORKLOADS = ("repeat", "agent")
#: The server's engine with its index of earlier outputs off (``--draft-memory-mb 0``) and on.
SERVER_ARMS = ("off", "on")


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
            out.append({"id": f"{task.id}#{r}", "messages": messages, "schema": task.schema, "max_tokens": max_tokens})
    return out


def _ask(engine: Any, request: Any) -> tuple[Any, dict[str, Any]]:
    """Submit ``request`` to ``engine`` and wait for its one choice: ``(choice, message)``."""
    events: queue.Queue = queue.Queue()
    job = engine.prepare(request, events.put)
    engine.submit(job)
    while True:
        kind, payload = events.get(timeout=3600)
        if kind == "choice":
            choice, message, _finish = payload
            return choice, message
        if kind == "error":
            raise RuntimeError(f"the engine failed a request: {payload}")


def _record(name: str, choice: Any) -> dict[str, Any]:
    stats = choice.row.stats
    return {
        "id": name,
        "tokens": len(choice.tokens),
        "target_forwards": stats.target_forwards,
        "proposed": dict(stats.proposed),
        "accepted": dict(stats.accepted),
        "output": choice.tokens,
    }


def _run_repeat(engine: Any, requests: list[dict[str, Any]], concurrency: int) -> list[dict[str, Any]]:
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
            choice, _ = _ask(
                engine,
                ChatRequest(
                    messages=body["messages"], schema=body["schema"], temperature=0.0, max_tokens=body["max_tokens"]
                ),
            )
            records[i] = _record(body["id"], choice)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in records if r is not None]


def _run_agent(engine: Any, conversations: dict[str, list[Any]], concurrency: int) -> list[dict[str, Any]]:
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
            )
            choice, message = _ask(engine, request)
            asked = {"messages": sent, "tool_choice": step.tool_choice, "max_tokens": step.max_new_tokens}
            records[j].append({**_record(f"{names[j]}#{j}/{turn}", choice), **asked})
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
    """``workload`` through a fresh engine per arm (drafts from earlier outputs ``on`` and ``off``).

    ``tasks``: the tasks of ``repeat`` (default: the task file at ``tasks_path``);
    ``conversations``: the scripts of ``agent`` (default: all of them).  ``arms``: ``off`` and ``on`` (the
    server's engine) and vLLM arms (:data:`grammarspec.bench.vllm_arms.VLLM_ARMS`, one request at a time,
    with the model at ``model_dir``; ``agent`` replays the server's turns: :mod:`grammarspec.bench.drafts_vllm`).
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
        raise ValueError("the vLLM arms replay the server's agent turns: add a server arm (on or off)")
    if workload == "repeat":
        from grammarspec.bench.tasks import load_tasks

        requests = repeat_requests(tasks if tasks is not None else load_tasks(tasks_path), repeat, max_tokens)
        if not requests:
            raise ValueError("no task has a schema: the repeat workload sends each task's schema")
    else:
        from grammarspec.bench.agent_tasks import CONVERSATIONS

        chosen = conversations if conversations is not None else CONVERSATIONS
    results: dict[str, Any] = {}
    for arm, megabytes in (("off", 0.0), ("on", draft_memory_mb)):
        if arm not in arms:
            continue
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
                records = _run_repeat(engine, requests, concurrency)
            else:
                records = _run_agent(engine, chosen, concurrency)
            seconds = time.perf_counter() - started
            index = engine.drafts.as_dict() if engine.drafts is not None else None
        finally:
            engine.close()
        results[arm] = {"seconds": seconds, "records": records, "index": index, **_totals(records, seconds)}
        progress(
            f"{workload} {arm}: {results[arm]['tokens_per_pass']:.3f} tokens/pass, {results[arm]['passes']} passes"
        )
    same = _same_outputs(results["off"]["records"], results["on"]["records"]) if len(results) == 2 else (0, 0)
    result = {"workload": workload, "concurrency": concurrency, "repeat": repeat, "arms": results, "identical": same}
    if vllm_arms:
        from grammarspec.bench.drafts_vllm import vllm_agent, vllm_repeat

        assert model_dir is not None
        if workload == "repeat":
            result["vllm"] = vllm_repeat(tokenizer, requests, vllm_arms, model_dir)
        else:
            turns = results["on" if "on" in results else "off"]["records"]
            result["vllm"] = vllm_agent(tokenizer, turns, vllm_arms, model_dir)
        progress(f"{workload} vLLM arms: {', '.join(vllm_arms)} done")
    return result


def _totals(records: Sequence[dict[str, Any]], seconds: float) -> dict[str, Any]:
    tokens = sum(r["tokens"] for r in records)
    passes = sum(r["target_forwards"] for r in records)
    proposed, accepted = source_totals(records, "proposed"), source_totals(records, "accepted")
    return {
        **rates(len(records), tokens, passes, seconds),
        "proposed": proposed,
        "accepted": accepted,
    }


def _same_outputs(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """``(equal, compared)``: requests (by id) whose outputs are the same token for token."""
    by_id = {r["id"]: r["output"] for r in a}
    compared = [r for r in b if r["id"] in by_id]
    return sum(by_id[r["id"]] == r["output"] for r in compared), len(compared)


def drafts_markdown(result: dict[str, Any], command: str) -> str:
    """Per arm, the counts, tokens per pass and tokens per second; drafts per source; the vLLM arms' table."""
    lines = [
        f"`{command}`",
        "",
        f"Workload `{result['workload']}`, {result['concurrency']} clients at once, greedy. "
        "`on`: drafts from earlier outputs (the server's index); `off`: `--draft-memory-mb 0`.",
    ]
    if result["arms"]:
        lines += [
            "",
            "| arm | requests | tokens | target passes | tokens / pass | tokens/s | suffix accepted / proposed |",
            "|---|---|---|---|---|---|---|",
        ]
    for arm, data in result["arms"].items():
        suffix = f"{data['accepted'].get('suffix', 0)}/{data['proposed'].get('suffix', 0)}"
        lines.append(
            f"| {arm} | {data['requests']} | {data['tokens']} | {data['passes']} | {data['tokens_per_pass']:.3f} | "
            f"{data['tokens_per_second']:.1f} | {suffix} |"
        )
    if result["arms"]:
        lines += ["", "Accepted / proposed draft tokens per source:", ""]
    for arm, data in result["arms"].items():
        per = ", ".join(f"{n} {data['accepted'].get(n, 0)}/{p}" for n, p in sorted(data["proposed"].items()))
        lines.append(f"- {arm}: {per or 'no drafts'}")
    equal, compared = result["identical"]
    if compared:
        lines += ["", f"- outputs identical between the arms: {equal}/{compared} requests"]
    on = result["arms"].get("on", {}).get("index")
    if on:
        lines.append(
            f"- the index at the end: {on['bytes'] / 2**20:.1f} MB of {on['max_bytes'] / 2**20:.0f}, "
            f"{on['outputs']} outputs, {on['ngrams']} n-grams, {on['scopes']} scopes, {on['evictions']} evicted"
        )
    if result.get("vllm"):
        lines += ["", *_vllm_markdown(result), ""]
    lines.append("- tokens/s follows the machine's load; the counts do not.")
    return "\n".join(lines) + "\n"


def _vllm_markdown(result: dict[str, Any]) -> list[str]:
    """The vLLM arms: one request at a time through one engine per arm, against ``vllm`` without drafts."""
    vllm = result["vllm"]
    plain = vllm.get("vllm", {})
    arm = "on" if "on" in result["arms"] else "off"
    server = {r["id"]: r["output"] for r in result["arms"].get(arm, {}).get("records", [])}
    lines = [
        "vLLM, the same requests one at a time through one engine per arm (tokens include the stop token; "
        "target passes = tokens - accepted drafts):",
        "",
        "| vLLM arm | requests | tokens | target passes | tokens / pass | tokens/s | x `vllm` tok/s | "
        "accepted / proposed | outputs = `vllm`'s | outputs = the server's |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, data in vllm.items():
        if "error" in data:
            lines.append(f"| {arm} | failed: {data['error'][:200]} | | | | | | | | |")
            continue
        speed = plain.get("tokens_per_second")
        ratio = f"{data['tokens_per_second'] / speed:.2f}x" if speed else "-"
        same_plain = _count_same(plain.get("outputs", {}), data["outputs"])
        same_server = _count_same(server, data["outputs"])
        lines.append(
            f"| `{arm}` | {data['requests']} | {data['tokens']} | {data['passes']} | {data['tokens_per_pass']:.3f} | "
            f"{data['tokens_per_second']:.1f} | {ratio} | {data['accepted']}/{data['proposed']} | "
            f"{same_plain} | {same_server} |"
        )
    refused = {task: error for data in vllm.values() for task, error in data.get("refused", {}).items()}
    if refused:
        first = next(iter(refused.values()))
        lines += ["", f"vLLM refused {len(refused)} of the requests in some arm (left out of its row): {first[:300]}"]
    return lines


def _count_same(reference: dict[str, Any], outputs: dict[str, Any]) -> str:
    """``"equal/compared"`` over the request ids both hold (``-`` when none)."""
    shared = [key for key in outputs if key in reference]
    return f"{sum(list(reference[k]) == list(outputs[k]) for k in shared)}/{len(shared)}" if shared else "-"
