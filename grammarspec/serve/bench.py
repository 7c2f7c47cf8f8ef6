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
  localhost port, the same requests; it does not constrain, so calls that are
  missing where one is required, or whose arguments do not validate, are counted
  as invalid.  Where it refuses a field (``tool_choice``), the request is sent
  without it and the refusal is noted.

Every call of every arm is checked against its tool's JSON Schema.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["SERVE_ARMS", "play_openai", "run_serve_bench", "serve_markdown"]

SERVE_ARMS = ("serve", "serve_concurrent", "hf_resend", "transformers_serve")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def play_openai(client: Any, model_id: str, script: list[Any], *, max_new_tokens: int | None = None,
                send_tool_choice: bool = True) -> dict[str, Any]:  # fmt: skip
    """One conversation through the client (streamed); wall time, tokens, calls, invalid calls, first-token times."""
    from ..bench.agent_tasks import SYSTEM, TOOLS, ModelTurn, run_tool

    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    record: dict[str, Any] = {"turns": 0, "tokens": 0, "calls": 0, "invalid": 0, "ttft": [], "errors": []}
    started = time.perf_counter()
    for step in script:
        if isinstance(step, str):
            messages.append({"role": "user", "content": step})
            continue
        assert isinstance(step, ModelTurn)
        kwargs: dict[str, Any] = {"tools": TOOLS}
        if send_tool_choice:
            kwargs["tool_choice"] = step.tool_choice
        t0 = time.perf_counter()
        first = None
        text, usage = "", None
        calls: dict[int, dict[str, str]] = {}  # tool call index -> its id, name and arguments so far
        stream = client.chat.completions.create(
            model=model_id, messages=messages, temperature=0, max_tokens=min(step.max_new_tokens, max_new_tokens or
            step.max_new_tokens), stream=True, stream_options={"include_usage": True}, **kwargs)  # fmt: skip
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                if first is None and (c.delta.content or c.delta.tool_calls):
                    first = time.perf_counter() - t0
                text += c.delta.content or ""
                for d in c.delta.tool_calls or []:
                    entry = calls.setdefault(d.index, {"id": d.id or f"call_{d.index}", "name": "", "arguments": ""})
                    entry["name"] += (d.function.name or "") if d.function else ""
                    entry["arguments"] += (d.function.arguments or "") if d.function else ""
        record["turns"] += 1
        record["ttft"].append(first)
        record["tokens"] += usage.completion_tokens if usage is not None else 0
        wanted = step.tool_choice != "none" and step.tool_choice != "auto"
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["name"], "arguments": c["arguments"]}}
                                     for _, c in sorted(calls.items())]  # fmt: skip
        elif wanted:
            record["invalid"] += 1  # a call was required and none came
        if step.tool_choice == "none" and calls:
            record["invalid"] += 1
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


class _InProcessServer:
    """grammarspec serve on a free localhost port, in a thread."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, name: str, max_batch_size: int) -> None:
        import uvicorn

        from .app import create_app
        from .engine import Engine

        self.engine = Engine(model, tokenizer, max_batch_size=max_batch_size)
        self.port = _free_port()
        config = uvicorn.Config(create_app(self.engine, name), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.engine.close()


class _TransformersServe:
    """``transformers serve`` as a subprocess on a free localhost port (``error`` says why it did not start)."""

    def __init__(self, timeout: float = 300.0) -> None:
        self.port = _free_port()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115
        self.error: str | None = None
        cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--device", "cpu", "--dtype", "float32"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ))
        deadline = time.time() + timeout
        import urllib.request

        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.error = f"exited with {self.proc.returncode}; log {self.log.name}"
                return
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=2)  # noqa: S310
                return
            except OSError:
                time.sleep(0.5)
        self.error = f"not answering after {timeout:.0f}s; log {self.log.name}"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_serve_bench(model: torch.nn.Module, tokenizer: Any, model_name: str, conversations: dict[str, list[Any]],
                    arms: list[str], *, concurrency: int = 8, repeat: int = 1, max_new_tokens: int | None = None,
                    progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:  # fmt: skip
    """Every conversation under every arm, interleaved (``repeat`` rounds); the records and a summary."""
    import openai

    from ..bench.agent import _Grammars, play
    from ..decoding import logits_width
    from ..vllm import model_path  # the model directory (no vLLM import)

    runs: list[dict[str, Any]] = []
    notes: list[str] = []
    grammar_server = _InProcessServer(model, tokenizer, model_name, max_batch_size=concurrency)
    clients = {"serve": openai.OpenAI(base_url=f"http://127.0.0.1:{grammar_server.port}/v1", api_key="-",
                                      max_retries=0, timeout=1800)}  # fmt: skip
    hf_server = None
    hf_model_id = str(model_path(model_name)) if "transformers_serve" in arms else ""
    if "transformers_serve" in arms:
        hf_server = _TransformersServe()
        if hf_server.error:
            notes.append(f"transformers serve did not start ({hf_server.error}); its arm is left out")
            arms = [a for a in arms if a != "transformers_serve"]
        else:
            clients["transformers_serve"] = openai.OpenAI(base_url=f"http://127.0.0.1:{hf_server.port}/v1",
                                                          api_key="-", max_retries=0, timeout=1800)  # fmt: skip
    grammars = _Grammars(tokenizer, logits_width(model))
    hf_tool_choice = True
    from grammars import grammar_spec

    from ..bench.agent_tasks import TOOLS, ModelTurn
    from ..tools import tool_constraint

    for script in conversations.values():  # compile every turn's grammar before timing (both servers' caches)
        for step in script:
            if isinstance(step, ModelTurn):
                constraint = tool_constraint(TOOLS, step.tool_choice, False, grammar_server.engine.tool_format)
                spec = grammar_spec(**constraint)
                if spec is not None:
                    grammar_server.engine._compile(spec)
                grammars.get(constraint)
    try:
        first = next(iter(conversations.values()))
        for arm in [a for a in arms if a in ("serve", "transformers_serve")]:  # warm-up, untimed
            model_id = model_name if arm == "serve" else hf_model_id
            try:
                play_openai(clients[arm], model_id, first[:2], max_new_tokens=8, send_tool_choice=hf_tool_choice)
            except openai.BadRequestError as e:
                if arm != "transformers_serve":
                    raise
                hf_tool_choice = False
                notes.append(f"transformers serve refused tool_choice ({str(e)[:160]}); sent without it")
            except openai.APIError as e:  # transformers serve failing on our conversations: its arm goes
                if arm != "transformers_serve":
                    raise
                notes.append(f"transformers serve failed on the warm-up conversation ({str(e)[:160]}); "
                             "its arm is left out")  # fmt: skip
                arms = [a for a in arms if a != "transformers_serve"]
        sequential = [a for a in arms if a != "serve_concurrent"]
        for r in range(repeat):
            for i, (name, script) in enumerate(conversations.items()):
                shift = (i + r) % max(1, len(sequential))
                for arm in sequential[shift:] + sequential[:shift]:
                    if arm == "hf_resend":
                        seconds, turns = play(model, tokenizer, script, "hf_resend", grammars)
                        record = {"turns": len(turns), "tokens": sum(len(t.tokens) for t in turns),
                                  "calls": sum(len(t.calls) for t in turns), "invalid": 0, "ttft": [],
                                  "seconds": seconds}  # fmt: skip
                    else:
                        model_id = model_name if arm == "serve" else hf_model_id
                        record = play_openai(clients[arm], model_id, script, max_new_tokens=max_new_tokens,
                                             send_tool_choice=hf_tool_choice or arm == "serve")  # fmt: skip
                    runs.append({"conversation": name, "arm": arm, "repeat": r, **record})
                    progress(f"{name} #{r} {arm}: {record['seconds']:.1f}s, {record['tokens']} tokens, "
                             f"{record['invalid']} invalid")  # fmt: skip
            if "serve_concurrent" in arms:
                scripts = [list(conversations.values())[j % len(conversations)] for j in range(concurrency)]
                t0 = time.perf_counter()
                with ThreadPoolExecutor(concurrency) as pool:
                    records = list(pool.map(lambda s: play_openai(clients["serve"], model_name, s,
                                                                  max_new_tokens=max_new_tokens), scripts))  # fmt: skip
                wall = time.perf_counter() - t0
                runs.append({"conversation": f"{concurrency} at once", "arm": "serve_concurrent", "repeat": r,
                             "seconds": wall, "tokens": sum(x["tokens"] for x in records),
                             "turns": sum(x["turns"] for x in records), "calls": sum(x["calls"] for x in records),
                             "invalid": sum(x["invalid"] for x in records),
                             "ttft": [t for x in records for t in x["ttft"]]})  # fmt: skip
                progress(f"{concurrency} conversations at once #{r}: {wall:.1f}s")
    finally:
        grammar_server.close()
        if hf_server is not None:
            hf_server.close()
    return {"runs": runs, "notes": notes, "concurrency": concurrency, "health": grammar_server.engine.counters}


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def serve_markdown(result: dict[str, Any], command: str) -> str:
    """The table: wall time per conversation, speed-up over hf_resend, throughput, invalid calls, TTFT."""
    runs = result["runs"]
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_arm.setdefault(run["arm"], []).append(run)
    base = {(r["conversation"], r["repeat"]): r["seconds"] for r in by_arm.get("hf_resend", [])}
    serve_tps = None
    if by_arm.get("serve"):
        serve_tps = sum(r["tokens"] for r in by_arm["serve"]) / sum(r["seconds"] for r in by_arm["serve"])
    lines = [f"`{command}`", "", "| arm | conversations | median s / conversation | x hf_resend (median) | tokens/s | "
             "x serve tokens/s | calls | invalid calls | median TTFT s |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm, items in by_arm.items():
        tps = sum(r["tokens"] for r in items) / max(1e-9, sum(r["seconds"] for r in items))
        ratios = [base[(r["conversation"], r["repeat"])] / r["seconds"] for r in items
                  if (r["conversation"], r["repeat"]) in base]  # fmt: skip
        ttft = _median([t for r in items for t in r["ttft"]])
        lines.append(
            f"| {arm} | {len(items)} | {_median([r['seconds'] for r in items]):.2f} | "
            f"{_median(ratios) and f'{_median(ratios):.2f}' or '-'} | {tps:.1f} | "
            f"{f'{tps / serve_tps:.2f}' if serve_tps else '-'} | {sum(r['calls'] for r in items)} | "
            f"{sum(r['invalid'] for r in items)} | {f'{ttft:.3f}' if ttft is not None else '-'} |"
        )
    lines += [""] + [f"- {note}" for note in result["notes"]]
    return "\n".join(lines) + "\n"
