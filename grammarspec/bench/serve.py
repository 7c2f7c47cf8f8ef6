"""``grammarspec bench-serve``: agent conversations through the ``openai`` client, against several servers.

Arms (greedy; the agent benchmark's scripts, tools and Python tool functions,
:mod:`grammarspec.bench.agent_tasks`):

* ``serve`` -- ``grammarspec serve`` (in-process, a free localhost port), one
  conversation at a time, streamed (time to first token = the first non-empty delta);
* ``serve_concurrent`` -- the same server, ``concurrency`` conversations at once
  (throughput: generated tokens per second of wall clock);
* ``hf_resend`` -- Hugging Face ``generate`` + xgrammar's processor re-sending the
  whole conversation each turn (:func:`grammarspec.bench.agent.play`);
* ``transformers_serve`` -- ``transformers serve`` as a subprocess on a free
  localhost port.  It does not constrain, so calls that are missing where one is
  required, or whose arguments do not validate, are counted as invalid;
* ``vllm_serve`` -- vLLM's OpenAI server (``.venv-vllm``; structured outputs with
  xgrammar + n-gram speculation, the ``vllm-ngram`` arm's settings) as a subprocess.

The two foreign servers get the conversation rendered as grammarspec renders it
(:func:`foreign_messages`: the tools described in the system message, earlier
calls as their JSON text, the plain-text note on ``tool_choice="none"`` turns),
because SmolLM2's chat template drops ``tools=`` and ``tool_calls``; ``tools`` and
``tool_choice`` are still sent.  Where such a server returns no ``tool_calls``
but its text is a JSON call in grammarspec's format, the call is read from the
text (then validated like every other).

Every call of every arm is checked against its tool's JSON Schema, and every
arm's answers (per call: text, tool calls, token count) are kept in the records
(``outputs``) and compared with HF re-sending's, call by call.

``--sweep`` runs the load sweep instead (:mod:`grammarspec.bench.sweep`); the servers
themselves are started by :mod:`grammarspec.bench.servers`.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from grammarspec.bench.servers import (
    InProcessServer,
    Subprocess,
    local_client,
    start_transformers_serve,
    start_vllm_serve,
)

__all__ = [
    "SERVE_ARMS",
    "compare_outputs",
    "foreign_messages",
    "capped",
    "play_openai",
    "run_serve_bench",
    "serve_markdown",
]

SERVE_ARMS = ("serve", "serve_concurrent", "hf_resend", "transformers_serve", "vllm_serve")
FOREIGN_ARMS = ("transformers_serve", "vllm_serve")


def _valid_call(name: str, arguments: str, tools: list[dict[str, Any]]) -> bool:
    from grammars.validation import schema_errors

    spec = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
    if name not in spec:
        return False
    try:
        value = json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return False
    return not schema_errors(spec[name], value)


def foreign_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]], tool_choice: Any) -> list[dict]:
    """``messages`` as grammarspec's JSON tool format renders them, for a server whose template drops tools.  Pure.

    The same rendering as :func:`grammarspec.serve.engine.prompt_ids` before the
    template: the tools described in the system message (not under ``tool_choice="none"``), each earlier call as its
    JSON text, and :data:`~grammarspec.tool_calls.NO_TOOL_NOTE` on the last user
    message of a ``tool_choice="none"`` turn.  ``tool_call_id`` stays (OpenAI
    servers want it; the template does not print it).
    """
    from grammarspec.tool_calls import NO_TOOL_NOTE, add_note, chat_messages

    offered = tools if tool_choice != "none" else None  # "none": no call format in the prompt
    rendered = chat_messages([_unparsed_calls_as_text(m) for m in messages], offered, "json")
    ids = [m.get("tool_call_id") for m in messages]
    offset = len(rendered) - len(messages)  # a system message added in front
    for i, call_id in enumerate(ids):
        if call_id is not None:
            rendered[i + offset]["tool_call_id"] = call_id
    if tools and tool_choice == "none":
        add_note(rendered, NO_TOOL_NOTE)
    return rendered


def _unparsed_calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message whose call arguments are not JSON (cut by ``max_tokens``) as its text.  Pure."""
    calls = message.get("tool_calls") or []
    try:
        for call in calls:
            json.loads(call["function"]["arguments"])
    except (json.JSONDecodeError, TypeError, KeyError):
        text = "".join(
            f'{{"name":{json.dumps(c["function"].get("name"))},"arguments":{c["function"].get("arguments") or ""}}}'
            for c in calls
        )
        return {"role": "assistant", "content": ((message.get("content") or "") + text)}
    return message


def _text_calls(text: str, tools: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The calls in ``text`` when it is a JSON call in grammarspec's format (else none).  Pure."""
    from grammarspec.tool_calls import ToolCallError, parse_tool_reply

    try:
        message = parse_tool_reply(text, tools, "json", [f"text_call_{i}" for i in range(64)])
    except (ToolCallError, KeyError, TypeError, AttributeError):
        return []
    return [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message.get("tool_calls") or []
    ]


def play_openai(
    client: Any,
    model_id: str,
    script: list[Any],
    *,
    max_new_tokens: int | None = None,
    send_tool_choice: bool = True,
    render: Callable[[list[dict], Any], list[dict]] | None = None,
    text_calls: bool = False,
) -> dict[str, Any]:
    """One conversation through the client (streamed); wall time, tokens, calls, invalid calls, first-token times.

    ``render(messages, tool_choice)``: the messages to send (default: as they are).
    ``text_calls``: read a JSON call from the text when the server returns no
    ``tool_calls``.  ``outputs``: per call, its ``content``, ``tool_calls``
    (``[name, arguments]``), ``tokens`` and ``finish_reason``.
    """
    from grammarspec.bench.agent_tasks import SYSTEM, TOOLS, ModelTurn, run_tool

    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    record: dict[str, Any] = {
        "turns": 0,
        "tokens": 0,
        "calls": 0,
        "invalid": 0,
        "ttft": [],
        "errors": [],
        "outputs": [],
        "text_calls": 0,
    }
    started = time.perf_counter()
    for step in script:
        if isinstance(step, str):
            messages.append({"role": "user", "content": step})
            continue
        assert isinstance(step, ModelTurn)
        kwargs: dict[str, Any] = {"tools": TOOLS}
        if send_tool_choice:
            kwargs["tool_choice"] = step.tool_choice
        sent = render(messages, step.tool_choice) if render is not None else messages
        t0 = time.perf_counter()
        first = None
        text, usage, finish = "", None, None
        calls: dict[int, dict[str, str]] = {}  # tool call index -> its id, name and arguments so far
        stream = client.chat.completions.create(
            model=model_id,
            messages=sent,
            temperature=0,
            max_tokens=min(step.max_new_tokens, max_new_tokens or step.max_new_tokens),
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                if first is None and (c.delta.content or c.delta.tool_calls):
                    first = time.perf_counter() - t0
                text += c.delta.content or ""
                finish = c.finish_reason or finish
                for d in c.delta.tool_calls or []:
                    entry = calls.setdefault(d.index, {"id": d.id or f"call_{d.index}", "name": "", "arguments": ""})
                    entry["name"] += (d.function.name or "") if d.function else ""
                    entry["arguments"] += (d.function.arguments or "") if d.function else ""
        if not calls and text_calls and step.tool_choice != "none":
            found = _text_calls(text, TOOLS)
            calls = dict(enumerate(found))
            record["text_calls"] += len(found)
        tokens = usage.completion_tokens if usage is not None else 0
        record["turns"] += 1
        record["ttft"].append(first)
        record["tokens"] += tokens
        wanted = step.tool_choice != "none" and step.tool_choice != "auto"
        message: dict[str, Any] = {"role": "assistant", "content": None if calls else (text or None)}
        if calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(calls.items())
            ]
        elif wanted:
            record["invalid"] += 1  # a call was required and none came
        if step.tool_choice == "none" and calls:
            record["invalid"] += 1
        record["outputs"].append(
            {
                "content": message["content"],
                "tool_calls": [
                    [c["function"]["name"], c["function"]["arguments"]] for c in message.get("tool_calls") or []
                ],
                "tokens": tokens,
                "finish_reason": finish,
            }
        )
        messages.append(message)
        for call in message.get("tool_calls") or []:
            record["calls"] += 1
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            ok = _valid_call(name, arguments, TOOLS)
            record["invalid"] += not ok
            result = run_tool(name, json.loads(arguments)) if ok else {"error": "invalid arguments"}
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
    record["seconds"] = time.perf_counter() - started
    return record


def _same_call(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two calls' outputs alike: text, tool calls (arguments as JSON values) and token count.  Pure."""

    def calls(output: dict[str, Any]) -> list[tuple[str, Any]]:
        out = []
        for name, arguments in output["tool_calls"]:
            try:
                out.append((name, json.loads(arguments)))
            except (json.JSONDecodeError, TypeError):
                out.append((name, arguments))
        return out

    return bool((a["content"] or "") == (b["content"] or "") and calls(a) == calls(b) and a["tokens"] == b["tokens"])


def compare_outputs(
    outputs: Sequence[dict[str, Any]], reference: Sequence[dict[str, Any]]
) -> tuple[int, int, int | None]:
    """``(identical calls, calls, index of the first different call or None)`` against ``reference``.  Pure.

    A call missing on either side counts as different; ``calls`` is the longer count.
    """
    n = max(len(outputs), len(reference))
    same = [i < len(outputs) and i < len(reference) and _same_call(outputs[i], reference[i]) for i in range(n)]
    first = next((i for i, ok in enumerate(same) if not ok), None)
    return sum(same), n, first


def capped(script: list[Any], max_new_tokens: int) -> list[Any]:
    """``script`` with every model turn's budget at most ``max_new_tokens``.  Pure."""
    from grammarspec.bench.agent_tasks import ModelTurn

    return [
        ModelTurn(s.tool_choice, min(s.max_new_tokens, max_new_tokens)) if isinstance(s, ModelTurn) else s
        for s in script
    ]


def _hf_outputs(tokenizer: Any, turns: Sequence[Any]) -> list[dict[str, Any]]:
    """HF re-sending's turns as ``outputs`` (the shape :func:`play_openai` records).  Pure."""
    eos = tokenizer.eos_token_id
    return [
        {
            "content": None if t.calls else tokenizer.decode(t.tokens, skip_special_tokens=True),
            "tool_calls": [[n, a] for n, a in t.calls],
            "tokens": len(t.tokens),
            "finish_reason": ("tool_calls" if t.calls else "stop") if t.tokens and t.tokens[-1] == eos else "length",
        }
        for t in turns
    ]


def run_serve_bench(
    model: torch.nn.Module,
    tokenizer: Any,
    model_name: str,
    conversations: dict[str, list[Any]],
    arms: list[str],
    *,
    concurrency: int = 8,
    repeat: int = 1,
    max_new_tokens: int | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Every conversation under every arm, interleaved (``repeat`` rounds); the records and a summary."""
    import openai

    from grammarspec.bench.agent import _Grammars, play
    from grammarspec.engine.decoding import logits_width
    from grammarspec.vllm import model_path  # the model directory (no vLLM import)

    if max_new_tokens is not None:  # every arm, HF re-sending included, gets the same budgets
        conversations = {name: capped(script, max_new_tokens) for name, script in conversations.items()}
    runs: list[dict[str, Any]] = []
    notes: list[str] = []
    grammar_server = InProcessServer(model, tokenizer, model_name, max_batch_size=concurrency)
    clients = {"serve": local_client(grammar_server.port)}
    model_ids = {"serve": model_name}
    foreign: list[Subprocess] = []
    workdir = tempfile.mkdtemp(prefix="grammarspec-bench-serve-")

    def drop(arm: str, why: str) -> None:
        nonlocal arms
        notes.append(f"{arm}: {why}; its arm is left out")
        arms = [a for a in arms if a != arm]

    def connect(arm: str, server: Subprocess | str, note: str) -> None:
        """Talk to ``server`` as ``arm`` (noting how it runs), or leave the arm out saying why it did not start."""
        if isinstance(server, str):
            return drop(arm, server)
        foreign.append(server)
        if server.error:
            return drop(arm, f"did not start ({server.error})")
        clients[arm] = local_client(server.port)
        notes.append(note)

    try:
        if "transformers_serve" in arms:
            server, model_ids["transformers_serve"] = start_transformers_serve(model, model_path(model_name), workdir)
            connect(
                "transformers_serve",
                server,
                "transformers_serve: started with a copy of the model directory whose config.json "
                "names the architecture (the embedded model's has `architectures: null`, which "
                "transformers serve answers with a 500); it ignores `tool_choice` (a logged warning) "
                "and cannot constrain, so a required call it does not write is invalid",
            )
        if "vllm_serve" in arms:
            model_ids["vllm_serve"] = model_name
            connect(
                "vllm_serve",
                start_vllm_serve(model_path(model_name), model_name),
                "vllm_serve: vLLM's OpenAI server, xgrammar structured outputs (compact JSON) + "
                "n-gram speculation (prompt lookup 2-5, 8 draft tokens), float32, eager; "
                "`--tool-call-parser pythonic` (vLLM refuses tool_choice other than none without "
                "a parser); its required and named calls are vLLM's own constrained format "
                "(`[{name, parameters}]`), so its token counts differ from the other arms'",
            )
        if any(a in FOREIGN_ARMS for a in arms):
            notes.append(
                "transformers_serve / vllm_serve get the conversation rendered as grammarspec renders it "
                "(tools described in the system message, earlier calls as JSON text, the plain-text note "
                "on tool_choice=none turns: SmolLM2's template drops `tools` and `tool_calls`), with "
                "`tools` and `tool_choice` sent too; a reply with no `tool_calls` whose text is a JSON "
                "call is read as that call (counted in serve.json's `text_calls`)"
            )
        grammars = _Grammars(tokenizer, logits_width(model))
        from grammars import grammar_spec
        from grammarspec.bench.agent_tasks import TOOLS, ModelTurn
        from grammarspec.tool_calls import tool_constraint

        for script in conversations.values():  # compile every turn's grammar before timing (both servers' caches)
            for step in script:
                if isinstance(step, ModelTurn):
                    constraint = tool_constraint(TOOLS, step.tool_choice, False, grammar_server.engine.tool_format)
                    spec = grammar_spec(**constraint)
                    if spec is not None:
                        grammar_server.engine.compile(spec)
                    grammars.get(constraint)

        def play_arm(arm: str, script: list[Any], cap: int | None = None) -> dict[str, Any]:
            extra: dict[str, Any] = {}
            if arm in FOREIGN_ARMS:
                extra = {"render": lambda m, choice: foreign_messages(m, TOOLS, choice), "text_calls": True}
            return play_openai(clients[arm], model_ids[arm], script, max_new_tokens=cap, **extra)

        first = next(iter(conversations.values()))
        for arm in [a for a in arms if a in ("serve", *FOREIGN_ARMS)]:  # warm-up, untimed
            try:
                play_arm(arm, first[:2], 8)
            except openai.APIError as e:  # a foreign server failing on our conversations: its arm goes
                if arm not in FOREIGN_ARMS:
                    raise
                drop(arm, f"failed on the warm-up conversation ({str(e)[:200]})")
        sequential = [a for a in arms if a != "serve_concurrent"]
        for r in range(repeat):
            for i, (name, script) in enumerate(conversations.items()):
                shift = (i + r) % max(1, len(sequential))
                for arm in sequential[shift:] + sequential[:shift]:
                    if arm == "hf_resend":
                        seconds, turns = play(model, tokenizer, script, "hf_resend", grammars)
                        record = {
                            "turns": len(turns),
                            "tokens": sum(len(t.tokens) for t in turns),
                            "calls": sum(len(t.calls) for t in turns),
                            "invalid": 0,
                            "ttft": [],
                            "seconds": seconds,
                            "outputs": _hf_outputs(tokenizer, turns),
                        }
                    else:
                        try:
                            record = play_arm(arm, script)
                        except openai.APIError as e:
                            if arm not in FOREIGN_ARMS:
                                raise
                            notes.append(f"{arm} failed on {name} #{r}: {str(e)[:200]}")
                            continue
                    runs.append({"conversation": name, "arm": arm, "repeat": r, **record})
                    progress(
                        f"{name} #{r} {arm}: {record['seconds']:.1f}s, {record['tokens']} tokens, "
                        f"{record['invalid']} invalid"
                    )
            if "serve_concurrent" in arms:
                names = [list(conversations)[j % len(conversations)] for j in range(concurrency)]
                t0 = time.perf_counter()
                with ThreadPoolExecutor(concurrency) as pool:
                    records = list(pool.map(lambda n: play_arm("serve", conversations[n]), names))
                wall = time.perf_counter() - t0
                runs.append(
                    {
                        "conversation": f"{concurrency} at once",
                        "arm": "serve_concurrent",
                        "repeat": r,
                        "seconds": wall,
                        "tokens": sum(x["tokens"] for x in records),
                        "turns": sum(x["turns"] for x in records),
                        "calls": sum(x["calls"] for x in records),
                        "invalid": sum(x["invalid"] for x in records),
                        "ttft": [t for x in records for t in x["ttft"]],
                        "conversations": [{"conversation": n, "outputs": x["outputs"]} for n, x in zip(names, records)],
                    }
                )
                progress(f"{concurrency} conversations at once #{r}: {wall:.1f}s")
    finally:
        grammar_server.close()
        for server in foreign:
            server.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return {"runs": runs, "notes": notes, "concurrency": concurrency, "health": grammar_server.engine.counters}


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _agreement(result: dict[str, Any]) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Per arm, ``(identical calls, calls)`` against HF re-sending (same conversation and repeat), and one line
    per conversation run that differs (its first different call, both sides).  Pure."""
    reference = {(r["conversation"], r["repeat"]): r["outputs"] for r in result["runs"] if r["arm"] == "hf_resend"}
    counts: dict[str, tuple[int, int]] = {}
    lines: list[str] = []

    def short(output: dict[str, Any]) -> str:
        what = json.dumps(output["tool_calls"]) if output["tool_calls"] else json.dumps(output["content"] or "")
        return f"{what[:100]}{'...' if len(what) > 100 else ''} ({output['tokens']} tokens)"

    for run in result["runs"]:
        if run["arm"] == "hf_resend":
            continue
        parts = run.get("conversations") or [{"conversation": run["conversation"], "outputs": run.get("outputs")}]
        for part in parts:
            ref = reference.get((part["conversation"], run["repeat"]))
            if ref is None or part["outputs"] is None:
                continue
            same, n, first = compare_outputs(part["outputs"], ref)
            k, total = counts.get(run["arm"], (0, 0))
            counts[run["arm"]] = (k + same, total + n)
            if first is not None:
                ours = part["outputs"][first] if first < len(part["outputs"]) else None
                theirs = ref[first] if first < len(ref) else None
                lines.append(
                    f"{run['arm']}, {part['conversation']} #{run['repeat']}: {same}/{n} identical; first "
                    f"difference at call {first + 1}: {short(ours) if ours else 'none'} against HF "
                    f"re-sending's {short(theirs) if theirs else 'none'}"
                )
    return counts, lines


def serve_markdown(result: dict[str, Any], command: str) -> str:
    """The table: wall time per conversation, speed-up over hf_resend, throughput, invalid calls, TTFT, agreement."""
    runs = result["runs"]
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_arm.setdefault(run["arm"], []).append(run)
    base = {(r["conversation"], r["repeat"]): r["seconds"] for r in by_arm.get("hf_resend", [])}
    serve_tps = None
    if by_arm.get("serve"):
        serve_tps = sum(r["tokens"] for r in by_arm["serve"]) / sum(r["seconds"] for r in by_arm["serve"])
    agreement, differences = _agreement(result)
    lines = [
        f"`{command}`",
        "",
        "| arm | conversations | median s / conversation | x hf_resend (median) | tokens/s | "
        "x serve tokens/s | tool calls | invalid calls | median TTFT s | identical calls k/n |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, items in by_arm.items():
        tps = sum(r["tokens"] for r in items) / max(1e-9, sum(r["seconds"] for r in items))
        ratios = [
            base[(r["conversation"], r["repeat"])] / r["seconds"]
            for r in items
            if (r["conversation"], r["repeat"]) in base
        ]
        ttft = _median([t for r in items for t in r["ttft"]])
        same = agreement.get(arm)
        lines.append(
            f"| {arm} | {len(items)} | {_median([r['seconds'] for r in items]):.2f} | "
            f"{_median(ratios) and f'{_median(ratios):.2f}' or '-'} | {tps:.1f} | "
            f"{f'{tps / serve_tps:.2f}' if serve_tps else '-'} | {sum(r['calls'] for r in items)} | "
            f"{sum(r['invalid'] for r in items)} | {f'{ttft:.3f}' if ttft is not None else '-'} | "
            f"{f'{same[0]}/{same[1]}' if same else '-'} |"
        )
    lines += [
        "",
        "- identical calls: one call is one chat completion (a model turn); identical = the same text, the "
        "same tool calls and the same number of tokens as HF re-sending's call in the same conversation and "
        "round (every arm is greedy). Each call's output is in serve.json (`runs[].outputs`).",
    ]
    lines += [f"- {note}" for note in result["notes"]]
    if differences:
        lines += ["", "Differences from HF re-sending (first different call of each conversation run):", ""]
        lines += [f"- {line}" for line in differences]
    return "\n".join(lines) + "\n"
