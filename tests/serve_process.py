"""A real ``grammarspec serve`` process on a free loopback port, under an address-space cap (test helper).

Used by the test modules that talk to the server as its users do: one process
per module, started with the embedded SmolLM2-135M; and the README's snippets
those modules run as written.  ``server_process`` starts any such server
command (the vLLM suite starts vLLM's OpenAI server with it).
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx  # what the openai client ships with

MODEL = "smollm2-135m"
#: The address-space cap the server runs under (RLIMIT_AS): a runaway request fails inside it, not the machine.
MEMORY_CAP = 8 << 30


@contextlib.contextmanager
def engine_server(engine, *, start_timeout: float = 300) -> Iterator[str]:
    """``engine`` served by ``grammarspec serve``'s app, uvicorn in a thread of this process: yields its base URL
    (``http://127.0.0.1:PORT``); on exit the server stops and the engine closes."""
    import threading

    import uvicorn

    from grammarspec.serve.app import create_app

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(engine, MODEL), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + start_timeout
    while not srv.started:
        assert time.time() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=30)
        engine.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server_process(
    command: list[str],
    port: int,
    *,
    memory_cap: int | None = MEMORY_CAP,
    start_timeout: float = 300.0,
    env: dict[str, str] | None = None,
) -> Iterator[tuple[str, int]]:
    """Any HTTP server ``command`` listening on ``port``; yields ``(base_url, pid)`` once ``/health`` answers.

    ``memory_cap=None`` runs it uncapped (vLLM reserves more address space than it uses).  The server's
    output goes to a log file whose tail is in the error when it exits or does not start; SIGINT stops it after.
    """

    def cap() -> None:
        if memory_cap is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_cap, memory_cap))

    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"test-server-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=cap,
            cwd=Path(__file__).resolve().parents[1],
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[:3]} exited ({process.returncode}): {log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command[:3]} did not start: {log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url, process.pid
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.unlink(missing_ok=True)


@contextlib.contextmanager
def serve_process(
    *args: str, memory_cap: int = MEMORY_CAP, start_timeout: float = 300.0, env: dict[str, str] | None = None
) -> Iterator[tuple[str, int]]:
    """``grammarspec serve`` with ``args`` (``env``: its environment; default: this one's); yields ``(base_url, pid)``
    once ``/health`` answers; stops it after."""
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "grammarspec"),
        "serve",
        MODEL,
        "--port",
        str(port),
        "--log-level",
        "warning",
        *args,
    ]
    with server_process(command, port, memory_cap=memory_cap, start_timeout=start_timeout, env=env) as started:
        yield started


def readme_block(heading: str, starts: str, language: str = "python") -> str:
    """The README's first ``language`` block (``""``: a bare fence) after ``heading`` that starts with ``starts``."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text[text.index(heading) :]
    blocks = re.finditer(r"^```(\w*)\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    return next(m[2] for m in blocks if m[1] == language and m[2].startswith(starts))
