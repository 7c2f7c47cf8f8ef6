"""A sweep's clients: a closed or open loop of ``openai`` clients against a server, in a process of their own.

The load generator never shares the server's process: its client threads
parse every streamed chunk in Python, and in the server's process they would
hold the interpreter lock the engine needs between its kernels, so the
clients' work would be timed as the server's (and weigh most on an arm that
does more host work a step).  vLLM's ``benchmark_serving`` runs apart from the
server for the same reason.  :func:`run_load` starts this file as a script
(stdlib and ``openai`` only: no torch, no grammarspec import), hands it the
run as JSON on stdin and reads the records back from stdout; the times in
them are the child's own clock, consistent within a run.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["OUR_ARMS", "closed_loop", "open_loop", "run_load", "send"]

#: The arms that name grammarspec's ``assistant`` in the request body (the others are foreign servers).
OUR_ARMS = ("none", "auto")


def send(client: Any, model_id: str, body: dict[str, Any], arm: str, max_tokens: int) -> dict[str, Any]:
    """One streamed request; its times, tokens and text (``refused``: the server's error, a request it would not
    serve, e.g. a schema its grammar backend rejects; the level goes on without it)."""
    import openai

    extra = {"extra_body": {"grammarspec": {"assistant": arm}}} if arm in OUR_ARMS else {}
    sent = time.perf_counter()
    first = last = None
    text, tokens, finish, refused = "", 0, None, None
    try:
        stream = client.chat.completions.create(
            model=model_id,
            temperature=0,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            **body,
            **extra,
        )
        for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            for c in chunk.choices:
                if c.delta.content:
                    last = time.perf_counter()
                    first = first if first is not None else last
                    text += c.delta.content
                finish = c.finish_reason or finish
    except openai.APIError as error:
        if isinstance(error, openai.APIConnectionError):
            raise  # the server is gone: nothing more of the arm can be measured
        refused = str(error)
    end = time.perf_counter()
    ttft = (first - sent) if first is not None else None
    itl = (last - first) / (tokens - 1) if first is not None and last is not None and tokens > 1 else None
    record = {"sent": sent, "end": end, "ttft": ttft, "itl": itl, "tokens": tokens, "text": text, "finish": finish}
    return record | {"refused": refused}


def closed_loop(
    send: Callable[[dict[str, Any]], dict[str, Any]], bodies: Sequence[dict[str, Any]], concurrency: int
) -> list[dict[str, Any]]:
    """``concurrency`` clients, each sending its next body when its last answer ends; records in body order."""
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(send, bodies))


def open_loop(
    send: Callable[[dict[str, Any]], dict[str, Any]], bodies: Sequence[dict[str, Any]], rate: float, seed: int = 0
) -> list[dict[str, Any]]:
    """Bodies sent at random times, ``rate`` a second on average (Poisson arrivals, fixed ``seed``)."""
    rng = random.Random(seed)
    start = time.perf_counter()
    at, times = 0.0, []
    for _ in bodies:
        times.append(at)
        at += rng.expovariate(rate)

    def timed(i: int) -> dict[str, Any]:
        time.sleep(max(0.0, start + times[i] - time.perf_counter()))
        return send(bodies[i])

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(timed, range(len(bodies))))


def run_load(
    port: int,
    model_id: str,
    arm: str,
    bodies: Sequence[dict[str, Any]],
    *,
    concurrency: int | None = None,
    rate: float | None = None,
    max_tokens: int,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """``bodies`` sent to the server on this machine's ``port`` by a client process of their own: a closed loop of
    ``concurrency`` clients, or an open loop at ``rate`` requests a second.  The records in body order.  Raises
    ``RuntimeError`` with the child's error when it fails (the server went away, a client broke)."""
    if (concurrency is None) == (rate is None):
        raise ValueError("run_load needs exactly one of concurrency (closed loop) and rate (open loop)")
    spec = {
        "port": port,
        "model": model_id,
        "arm": arm,
        "bodies": list(bodies),
        "concurrency": concurrency,
        "rate": rate,
        "max_tokens": max_tokens,
        "seed": seed,
    }
    done = subprocess.run(
        [sys.executable, __file__], input=json.dumps(spec), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise RuntimeError(f"the {arm} arm's client process failed: {tail[0]}")
    return list(json.loads(done.stdout))


def _main() -> None:
    """The child: read the run from stdin, send it, write the records to stdout."""
    import openai

    spec = json.load(sys.stdin)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{spec['port']}/v1", api_key="-", max_retries=0, timeout=3600)

    def one(body: dict[str, Any]) -> dict[str, Any]:
        return send(client, spec["model"], body, spec["arm"], spec["max_tokens"])

    if spec["concurrency"] is not None:
        records = closed_loop(one, spec["bodies"], int(spec["concurrency"]))
    else:
        records = open_loop(one, spec["bodies"], float(spec["rate"]), seed=int(spec["seed"]))
    json.dump(records, sys.stdout)


if __name__ == "__main__":
    _main()
