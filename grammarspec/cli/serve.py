"""The ``grammarspec serve`` and ``grammarspec bench-serve`` subcommands: their options and their glue to the server.

:func:`add_serve_commands` adds both to :func:`grammarspec.cli.main.build_parser`'s subcommands; the shared
helpers (model loading, argument checks, report writing) are :mod:`grammarspec.cli.common`'s, read through
the module so that one patched helper serves every subcommand.  Most options take one value: they are written
as tables, a row an option, that :func:`grammarspec.cli.common.add_values` adds in order.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grammarspec.cli import common as cli_common

__all__ = ["add_serve_commands"]

_count = cli_common.positive_int
_megabytes = cli_common.non_negative_float
_non_negative_int = cli_common.number(int, 0)


def _positive_seconds_or_mb(text: str) -> float:
    """An argparse ``type=``: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def add_serve_commands(commands: Any) -> None:
    from grammars.registry import BACKEND_CHOICES
    from grammars.registry import DEFAULT as DEFAULT_BACKEND
    from grammarspec.policy.step_cost import STEP_COSTS
    from grammarspec.serve.engine import COMPILE_TIMEOUT
    from grammarspec.serve.guard import DEFAULT_MAX_BODY_MB

    serve = commands.add_parser(
        "serve",
        help="an OpenAI-compatible server (Chat Completions) with exact constrained speculation",
        description="Serve POST /v1/chat/completions (response_format, tools, tool_choice, parallel_tool_calls, "
        "stream, temperature, top_p, max_tokens, stop, seed, n), GET /v1/models and GET /health. One "
        "continuous-batching decode loop serves every open request; recent conversations' KV is reused by prefix. "
        "A field the server cannot honour is refused with a 400 in OpenAI's error shape. Before exposing it "
        "(--host 0.0.0.0), give it a key (--api-key); bodies and prompts are capped (--max-body-mb, "
        "--max-prompt-chars).",
    )
    serve.add_argument(
        "model",
        nargs="?",
        default=cli_common.DEFAULT_MODEL,
        metavar="MODEL",
        help=f"embedded model name or local model directory (default: {cli_common.DEFAULT_MODEL})",
    )
    # Option tables: one row an option, its help below when the row would run long.
    # fmt: off
    cli_common.add_values(serve, (
        ("--host", None, "127.0.0.1", None, "address to listen on (default: 127.0.0.1)"),
        ("--port", _count, 8000, None, "port (default: 8000)"),
        ("--served-model-name", None, None, "NAME", "the model id clients send and /v1/models lists (default: MODEL)"),
        ("--max-batch-size", _count, 8, "N",
         "rows decoded together; more requests wait and join as rows finish (default: 8)"),
        ("--max-tokens", _count, 1024, "N",
         "the most new tokens one request may ask for (default: 1024; the context also bounds it)"),
        ("--prefix-cache-mb", _megabytes, 1024.0, "MB",
         "memory budget of the prefix KV cache, LRU-evicted (default: 1024; 0 turns it off)"),
        ("--draft-memory-mb", _megabytes, 256.0, "MB",
         "memory of the index of earlier outputs that requests with the same schema or tools draft from, "
         "oldest evicted first (default: 256; 0 turns it off)"),
        ("--prompt-chunk", _count, None, "N",
         "the most prompt tokens one step reads for requests that join a busy batch, beside the decoding "
         "rows (default: derived from the measured pass cost, so a step costs at most twice a plain one)"),
        ("--grammar-cache-size", _count, 128, "N",
         "compiled grammars kept, one per distinct schema / tool set (default: 128)"),
        ("--step-cost", STEP_COSTS, "learned", None,
         "what the drafting policy prices a step by: learned (default), the seconds this server's own steps "
         "take, starting from the profiled pass cost; profile, the profile alone, for draft lengths that do not "
         "depend on timing"),
        ("--grammar-backend", BACKEND_CHOICES, DEFAULT_BACKEND, None, None),
        ("--tool-format", None, "auto", "FORMAT",
         "how tool calls are written: auto (the chat template's, else json), json, or an "
         "xgrammar model format (default: auto)"),
        ("--compile-timeout", _positive_seconds_or_mb, COMPILE_TIMEOUT, "SECONDS",
         f"the longest one request's grammar may take to compile, over every backend tried; past it the "
         f"request is a 400 (default: {COMPILE_TIMEOUT:g})"),
        ("--log-level", ("critical", "error", "warning", "info", "debug"), "info", None, None),
    ))
    security = serve.add_argument_group(
        "a public endpoint",
        "what guards a server others can reach (--host 0.0.0.0): a key, and the size of what is read",
    )
    cli_common.add_values(security, (
        ("--api-key", None, None, "KEY",
         "the key every request must send as 'Authorization: Bearer KEY' (the openai client's api_key); "
         "a missing or wrong key is a 401. GET /health stays open for liveness probes and answers only its status "
         "without the key (default: the environment variable GRAMMARSPEC_API_KEY; neither: no key, an open server)"),
        ("--max-body-mb", _positive_seconds_or_mb, DEFAULT_MAX_BODY_MB, "MB",
         f"the largest request body read, in MiB; a larger one is a 413 before it is read or parsed "
         f"(default: {DEFAULT_MAX_BODY_MB:g})"),
        ("--max-prompt-chars", _non_negative_int, None, "N",
         "the most characters of message text a request may hold; more is a 400 before the tokenizer sees "
         "it (default: the model's context in tokens times its longest vocabulary entry in characters, which no "
         "prompt that fits the context passes; 0: no limit)"),
    ))
    # fmt: on
    cli_common.add_placement(serve)
    serve.set_defaults(run=_cmd_serve)

    bench = commands.add_parser(
        "bench-serve",
        help="time agent conversations through the openai client: grammarspec serve against other servers",
        description="Run the agent benchmark's conversations through the openai client against grammarspec serve "
        "(1 conversation, then --concurrency at once), transformers serve (it cannot constrain; its invalid calls are "
        "counted), vllm serve (structured outputs + n-gram speculation, where .venv-vllm exists) and HF generate + "
        "xgrammar re-sending, interleaved; every call is compared with HF re-sending's; write serve.md and "
        "serve.json (every call's output) to --out.",
    )
    bench.add_argument("--model", default=cli_common.DEFAULT_MODEL, metavar="NAME_OR_DIR")
    cli_common.add_placement(bench)
    # fmt: off
    cli_common.add_values(bench, (
        ("--arms", None, None, "A,B",
         "arms (default: serve,serve_concurrent,hf_resend,"
         "transformers_serve,vllm_serve; vllm_serve is skipped with a note without .venv-vllm; "
         "with --sweep: none,auto, and vllm,vllm_ngram may be added; with --drafts: none,off,on, and vLLM's "
         "arms may be added: vllm,vllm-ngram,vllm-suffix,vllm-grammarspec,vllm-grammarspec-noindex)"),
        ("--concurrency", _count, 8, "N", "conversations at once for serve_concurrent (default: 8)"),
        ("--conversations", None, None, "A,B",
         "only these conversations (comma-separated: weather, orders, shopping, mixed)"),
        ("--repeat", _count, 1, "N", None),
        ("--max-new-tokens", _count, None, "N",
         "cap every turn's max_tokens (default: the scripts' own; for smoke runs)"),
        ("--out", None, "bench-out", "DIR", "output folder (default: bench-out)"),
    ))
    # fmt: on
    sweep = bench.add_argument_group(
        "load sweep (--sweep)",
        "grammarspec serve's throughput and latency as load rises, arms none and auto interleaved (none, auto, "
        "none) after an untimed burst of each level's width per arm, vllm / vllm_ngram (vllm serve without / with "
        "n-gram drafts, from .venv-vllm) as the anchor; "
        "writes sweep.md, sweep.json, sweep_throughput.png and sweep_ttft.png",
    )
    sweep.add_argument("--sweep", action="store_true", help="run the load sweep instead of the conversations")
    # fmt: off
    cli_common.add_values(sweep, (
        ("--levels", None, "1,2,4,8,16,32", "C,C", "closed-loop concurrencies (default: 1,2,4,8,16,32; '' for none)"),
        ("--rates", None, "", "R,R", "open-loop request rates per second, Poisson arrivals (default: none)"),
        ("--workloads", None, "json,prose", "A,B",
         "json (the task file, response_format json_schema) and/or prose (no schema)"),
        ("--requests", _count, 8, "N", "requests per level (at least C; default: 8)"),
        ("--rounds", _count, 1, "R",
         "closed loop: each client sends about R requests, so later ones join a busy batch (a level sends "
         "max(--requests, R x C); default: 1)"),
        ("--pairs", _count, 1, "P",
         "none and auto interleaved as none, then auto, none P times: more runs to average where the "
         "ratio is near 1; from 2, the report gives the runs' mean ratio and its standard error (default: 1)"),
        ("--max-batch-size", _count, 16, "N", "the servers' rows decoded together (default: 16)"),
        ("--step-cost", STEP_COSTS, "learned", None,
         "what the embedded server's drafting policy prices a step by, as serve --step-cost (default: learned)"),
        ("--tasks", None, None, "FILE", "task file of the json workload (default: data/tasks)"),
    ))
    # fmt: on
    sweep.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    drafts = bench.add_argument_group(
        "drafts from earlier outputs (--drafts)",
        "repeated structured traffic through the server's engine, plain decoding (none: every request with the "
        "assistant preset none) and auto drafting with the index of earlier outputs off (--draft-memory-mb 0) and "
        "on: tokens per target pass, target passes, accepted draft tokens per source, tokens/s, each drafting arm "
        "over none (all requests and the warm ones), outputs compared; writes drafts.md and drafts.json",
    )
    # fmt: off
    cli_common.add_values(drafts, (
        ("--drafts", ("repeat", "agent"), None, None,
         "repeat: every task-file schema sent --draft-repeat times with other documents, round-robin, "
         "--concurrency clients; agent: the agent conversations, --concurrency at once, with KV reuse"),
        ("--draft-repeat", _count, 3, "N", "requests per schema (default: 3)"),
        ("--draft-memory-mb", _megabytes, 256.0, "MB",
         "the index's memory in the on arm, as serve --draft-memory-mb (default: 256)"),
    ))
    # fmt: on
    bench.set_defaults(run=_cmd_bench_serve)


def _cmd_serve(args: argparse.Namespace, command: str) -> int:
    import importlib.util

    for package in ("starlette", "uvicorn"):
        if importlib.util.find_spec(package) is None:
            raise cli_common.CliError(f"serve needs {package}: pip install 'grammarspec[serve]'")
    from grammarspec.serve import Engine, serve
    from grammarspec.tool_calls import ToolCallError

    api_key = args.api_key if args.api_key is not None else os.environ.get("GRAMMARSPEC_API_KEY") or None
    if api_key is not None and not api_key.strip():
        raise cli_common.CliError("--api-key is empty: give a key, or leave the flag out for an open server")

    cli_common.quiet_transformers()
    model, tokenizer = cli_common.load(args.model, device=args.device, dtype=args.dtype)
    try:
        engine = Engine(
            model,
            tokenizer,
            max_batch_size=args.max_batch_size,
            max_tokens=args.max_tokens,
            prefix_cache_bytes=int(args.prefix_cache_mb * 2**20),
            grammar_backend=args.grammar_backend,
            grammar_cache_size=args.grammar_cache_size,
            tool_format=args.tool_format,
            prompt_chunk=args.prompt_chunk,
            step_cost=args.step_cost,
            draft_memory_bytes=int(args.draft_memory_mb * 2**20),
            compile_timeout=args.compile_timeout,
        )
    except ToolCallError as e:
        raise cli_common.CliError(f"--tool-format: {e}") from None
    name = args.served_model_name or args.model
    guarded = "an API key" if api_key else "no API key: anyone who can reach it may use it"
    print(f"grammarspec serve: {name} on http://{args.host}:{args.port}/v1 ({guarded})", file=sys.stderr)
    serve(
        engine,
        name,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        api_key=api_key,
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_prompt_chars="auto" if args.max_prompt_chars is None else (args.max_prompt_chars or None),
    )
    return 0


#: One bench-serve mode, its arguments checked: what it runs on the loaded model and tokenizer (given
#: ``progress=``), and how it reports the result (``out``, ``result``, ``command``).
_Mode = tuple[Callable[..., dict[str, Any]], Callable[[Path, dict[str, Any], str], None]]


def _cmd_bench_serve(args: argparse.Namespace, command: str) -> int:
    """Check the chosen mode's arguments, then ``--out``; only then load ``--model`` and run the mode."""
    mode = _sweep_mode if args.sweep else _drafts_mode if args.drafts else _conversations_mode
    run, report = mode(args)
    out = cli_common.out_folder(args.out)
    model, tokenizer = cli_common.load_for_timing(args.model, device=args.device, dtype=args.dtype)
    report(out, run(model, tokenizer, progress=lambda line: print(line, file=sys.stderr)), command)
    return 0


def _conversations_mode(args: argparse.Namespace) -> _Mode:
    from grammarspec.bench.agent_tasks import CONVERSATIONS
    from grammarspec.bench.serve import SERVE_ARMS, run_serve_bench, serve_markdown

    arms = cli_common.check_known("--arms", cli_common.split_names(args.arms or ",".join(SERVE_ARMS)), SERVE_ARMS)
    run = functools.partial(
        run_serve_bench,
        model_name=args.model,
        conversations=cli_common.chosen_conversations(args.conversations, CONVERSATIONS),
        arms=arms,
        concurrency=args.concurrency,
        repeat=args.repeat,
        max_new_tokens=args.max_new_tokens,
    )
    return run, lambda out, result, command: cli_common.write_report(
        out, "serve", serve_markdown(result, command), result
    )


def _drafts_mode(args: argparse.Namespace) -> _Mode:
    from grammarspec.bench.agent_tasks import CONVERSATIONS
    from grammarspec.bench.drafts import SERVER_ARMS, drafts_markdown, run_drafts_bench
    from grammarspec.bench.vllm_arms import VLLM_ARMS

    arms = cli_common.check_known(
        "--arms", cli_common.split_names(args.arms or ",".join(SERVER_ARMS)), SERVER_ARMS + VLLM_ARMS, "with --drafts "
    )
    model_dir = None
    if any(arm in VLLM_ARMS for arm in arms):
        if args.drafts == "agent" and not set(arms) & set(SERVER_ARMS):
            raise cli_common.CliError(
                "--arms: with --drafts agent the vLLM arms replay the server's turns: add none, off or on"
            )
        from grammarspec.bench.vllm_env import vllm_python
        from grammarspec.vllm import model_path

        try:
            vllm_python()
        except ValueError as e:
            raise cli_common.CliError(str(e)) from None
        model_dir = model_path(args.model)
    tasks = None
    if args.drafts == "repeat":  # the task file is read (and refused) before the model loads
        from grammarspec.bench.tasks import load_tasks

        try:
            tasks = load_tasks(args.tasks)
        except (OSError, ValueError) as e:
            raise cli_common.CliError(f"--tasks: {e}") from None
        if not any(task.schema for task in tasks):
            raise cli_common.CliError("--tasks: no task has a schema, and the repeat workload sends schemas")
    run = functools.partial(
        run_drafts_bench,
        tasks=tasks,
        workload=args.drafts,
        arms=arms,
        model_dir=model_dir,
        conversations=cli_common.chosen_conversations(args.conversations, CONVERSATIONS),
        concurrency=args.concurrency,
        repeat=args.draft_repeat,
        max_tokens=args.max_new_tokens or 96,
        draft_memory_mb=args.draft_memory_mb,
        tasks_path=args.tasks,
    )
    return run, lambda out, result, command: cli_common.write_report(
        out, "drafts", drafts_markdown(result, command), result
    )


def _sweep_mode(args: argparse.Namespace) -> _Mode:
    from grammarspec.bench.sweep import SWEEP_ARMS, WORKLOADS, run_sweep, write_sweep

    def listed(text: str, kind: Callable[[str], Any], flag: str) -> list[Any]:
        try:
            values = [kind(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError:
            raise cli_common.CliError(f"{flag}: expected a comma-separated list of numbers, got {text!r}") from None
        if any(v <= 0 for v in values):
            raise cli_common.CliError(f"{flag}: every value must be > 0, got {text!r}")
        return values

    def report(out: Path, result: dict[str, Any], command: str) -> None:
        print(write_sweep(result, command, out, plots=not args.no_plots))
        print(f"wrote {out / 'sweep.md'}, {out / 'sweep.json'} and the plots", file=sys.stderr)

    arms = cli_common.check_known(
        "--arms", cli_common.split_names(args.arms or "none,auto"), SWEEP_ARMS, "with --sweep "
    )
    workloads = cli_common.split_names(args.workloads)
    if not workloads or any(w not in WORKLOADS for w in workloads):
        raise cli_common.CliError(f"--workloads: choose from {', '.join(WORKLOADS)}, got {args.workloads!r}")
    levels, rates = listed(args.levels, int, "--levels"), listed(args.rates, float, "--rates")
    if not levels and not rates:
        raise cli_common.CliError("--levels and --rates are both empty: give at least one load level")
    run = functools.partial(
        run_sweep,
        model_name=args.model,
        workloads=workloads,
        concurrency=levels,
        rates=rates,
        arms=arms,
        requests=args.requests,
        rounds=args.rounds,
        pairs=args.pairs,
        max_tokens=args.max_new_tokens or 96,
        max_batch_size=args.max_batch_size,
        tasks_path=args.tasks,
        step_cost=args.step_cost,
    )
    return run, report
