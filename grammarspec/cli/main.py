"""The ``grammarspec`` command line: ``generate`` one constrained answer, or ``bench`` the proposers.

    grammarspec generate --schema person.json --prompt "Ada Lovelace, born 1815"
    grammarspec generate --tools tools.json --prompt "Weather in Oslo?" --assistant auto
    grammarspec bench --quick
    grammarspec bench --schemas /path/to/schemas --limit 21 --out bench-corpus

    grammarspec bench --batch-size 1,4,8 --out bench-batch
    grammarspec bench-agent --out bench-agent
    grammarspec serve --port 8000
    grammarspec bench-serve --out bench-serve
    grammarspec profile --show

Errors in the arguments or inputs exit with status 2 and say what to fix;
errors while generating exit with status 1.

The parser (the helpers every subcommand shares are :mod:`grammarspec.cli.common`'s) and the
``generate``, ``bench`` and ``bench-agent`` subcommands live here; the server's two
(``serve``, ``bench-serve``) live in :mod:`grammarspec.cli.serve`, ``profile`` in :mod:`grammarspec.cli.profile`.  The work itself is in
:mod:`grammarspec.bench`, :mod:`grammarspec.serve` and the library.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grammarspec.cli import common as cli_common
from grammarspec.cli.common import DEFAULT_MODEL

__all__ = ["main", "build_parser", "DEFAULT_MODEL", "BENCH_MAX_NEW_TOKENS", "QUICK"]

#: max_new_tokens of a full bench run: keeps the default task file under 30 minutes.
#: It covers most tool calls but cuts most extraction and generation answers; the
#: report then adds a table over the answers that ended by themselves.
BENCH_MAX_NEW_TOKENS = 128
#: What --quick changes (options given explicitly still win).
QUICK = {"limit": 3, "arms": "baseline,none,auto", "max_new_tokens": 48}


_int = cli_common.number(int)
_count = cli_common.positive_int
_temperature = cli_common.number(float, 0, " (0 means greedy)")


def build_parser() -> argparse.ArgumentParser:
    from grammars.registry import BACKEND_CHOICES
    from grammars.registry import DEFAULT as DEFAULT_BACKEND
    from grammarspec import __version__
    from proposers.presets import PRESETS

    parser = argparse.ArgumentParser(
        prog="grammarspec",
        description="Exact schema-constrained speculative decoding for Hugging Face models.",
    )
    parser.add_argument("--version", action="version", version=f"grammarspec {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    gen = commands.add_parser(
        "generate",
        help="generate one JSON answer that follows a schema or calls a tool",
        description="Generate one JSON answer and print it (stdout) and its statistics (stderr).",
    )
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--schema", metavar="FILE", help="JSON Schema file the answer must follow")
    source.add_argument(
        "--tools", metavar="FILE", help='JSON file with OpenAI-style tool definitions (a list, or {"tools": [...]})'
    )
    gen.add_argument("--prompt", required=True, metavar="TEXT", help="the user message ('-' reads it from stdin)")
    gen.add_argument("--system", metavar="TEXT", help="a system prompt")
    gen.add_argument("--parallel-tool-calls", action="store_true", help="with --tools: allow a list of calls")
    gen.add_argument(
        "--assistant", choices=PRESETS, default="auto", help="drafter preset (default: auto; none = no speculation)"
    )
    gen.add_argument("--draft-model", metavar="DIR", help="a draft model sharing the tokenizer (local directory)")
    gen.add_argument("--max-new-tokens", type=_count, default=512, metavar="N", help="default: 512")
    gen.add_argument(
        "--temperature",
        type=_temperature,
        default=0.0,
        metavar="T",
        help="sampling temperature; 0 (default) decodes greedily",
    )
    gen.add_argument("--seed", type=_int, default=0, metavar="S", help="random seed (default: 0)")
    gen.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        metavar="NAME_OR_DIR",
        help=f"embedded model name or local model directory (default: {DEFAULT_MODEL})",
    )
    gen.add_argument("--grammar-backend", choices=BACKEND_CHOICES, default=DEFAULT_BACKEND)
    gen.add_argument("--json", action="store_true", help="print one JSON object with the answer and statistics")
    gen.set_defaults(run=_cmd_generate)

    bench = commands.add_parser(
        "bench",
        help="measure speed and acceptance of every arm against plain constrained decoding",
        description=(
            "Run task files and schema corpora under the baseline (HF generate + xgrammar's logits "
            "processor), grammarspec without speculation, each proposer and the presets; write "
            "results.json, results.md and PNG plots to --out."
        ),
    )
    bench.add_argument(
        "--tasks",
        action="append",
        metavar="FILE",
        help="task file in the tasks.jsonl format (repeatable; default: $GRAMMARSPEC_TASKS, else "
        "the repository's data/tasks/tasks.jsonl, unless --schemas is given)",
    )
    bench.add_argument(
        "--schemas",
        action="append",
        metavar="DIR_OR_FILE",
        help="schema corpus: a <category>.jsonl file or a folder of them (repeatable)",
    )
    bench.add_argument(
        "--limit", type=_count, metavar="N", help="run at most N tasks, taken round-robin over the categories"
    )
    bench.add_argument("--categories", metavar="A,B", help="only these categories (comma-separated)")
    bench.add_argument("--model", default=DEFAULT_MODEL, metavar="NAME_OR_DIR")
    bench.add_argument(
        "--arms",
        metavar="A,B",
        help="arms to run (comma-separated; the baseline always runs). Known: baseline, none, "
        "jump_forward, prompt_lookup, schema_ngram, auto, draft_model, auto+draft, vllm, vllm-ngram, "
        "vllm-suffix, vllm-grammarspec, vllm-grammarspec-noindex (in .venv-vllm: make vllm-env; vllm-suffix "
        "also needs make vllm-suffix). Default: "
        "all but the vLLM arms and the draft arms, which are added with --draft-model",
    )
    bench.add_argument("--draft-model", metavar="DIR", help="a draft model sharing the tokenizer")
    bench.add_argument(
        "--temperature",
        type=_temperature,
        default=0.0,
        metavar="T",
        help="0 (default): greedy, and agreement with the baseline is checked",
    )
    bench.add_argument(
        "--max-new-tokens",
        type=_count,
        metavar="N",
        help=f"default: {BENCH_MAX_NEW_TOKENS} ({QUICK['max_new_tokens']} with --quick)",
    )
    bench.add_argument("--seed", type=_int, default=0, metavar="S")
    bench.add_argument("--repeat", type=_count, default=1, metavar="N", help="runs per task and arm")
    bench.add_argument("--out", default="bench-out", metavar="DIR", help="output folder (default: bench-out)")
    bench.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: {QUICK['limit']} tasks, arms {QUICK['arms']}, "
        f"max_new_tokens {QUICK['max_new_tokens']} (explicit options win)",
    )
    bench.add_argument(
        "--batch-size",
        metavar="B,B",
        help="throughput mode: cut the tasks into batches of B requests and run HF generate + "
        "xgrammar's processor on each batch, and grammarspec 'none' and 'auto' with "
        "max_batch_size=B (e.g. 1,4,8,16; --arms picks among baseline,none,auto); greedy",
    )
    bench.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument(
        "--tokenizers",
        metavar="DIR",
        help="tokenizer families: for --model's tokenizer and each ggml-vocab-*.gguf in DIR, tokens per target "
        "pass of --arms' preset (default auto) against a scripted target that writes each task's reference in "
        "the family's canonical split (counts, no timing; a folder of vocabulary-only GGUFs)",
    )
    bench.set_defaults(run=_cmd_bench)

    agent = commands.add_parser(  # the agent-loop benchmark
        "bench-agent",
        help="time whole tool-calling conversations: HF re-sending, HF with a prompt cache, grammarspec Conversation",
        description="Run the agent benchmark's multi-turn tool-calling conversations (greedy) under three arms, "
        "interleaved, and write agent.md and agent.json to --out.",
    )
    agent.add_argument("--model", default=DEFAULT_MODEL, metavar="NAME_OR_DIR")
    agent.add_argument("--repeat", type=_count, default=1, metavar="N", help="runs per conversation and arm")
    agent.add_argument("--conversations", metavar="A,B", help="only these conversations (comma-separated)")
    agent.add_argument("--out", default="bench-out", metavar="DIR", help="output folder (default: bench-out)")
    agent.set_defaults(run=_cmd_bench_agent)
    from grammarspec.cli.profile import add_profile_command
    from grammarspec.cli.serve import add_serve_commands

    add_serve_commands(commands)
    add_profile_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``grammarspec`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command = "grammarspec " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    try:
        return int(args.run(args, command) or 0)
    except cli_common.CliError as e:
        sub = f"grammarspec {args.command}"
        print(f"{sub}: error: {e}", file=sys.stderr)
        return 2


# --- generate -------------------------------------------------------------------------


def _read_json(path: str, what: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise cli_common.CliError(f"{what} {path}: no such file")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise cli_common.CliError(
            f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}"
        ) from None
    except UnicodeDecodeError:
        raise cli_common.CliError(f"{what} {path} is not UTF-8 text") from None


def _load_tools(path: str) -> list[dict[str, Any]]:
    data = _read_json(path, "--tools")
    if isinstance(data, dict) and "tools" in data:
        data = data["tools"]
    if isinstance(data, dict):  # a single tool definition
        data = [data]
    if not isinstance(data, list) or not data:
        raise cli_common.CliError(
            f'--tools {path} must hold a non-empty list of tool definitions (or {{"tools": [...]}})'
        )
    return data


def _cli_words(message: str) -> str:
    """The library's advice in the CLI's own terms (``grammar_backend='outlines'`` -> ``--grammar-backend outlines``)."""
    return re.sub(r"(?:grammar_)?backend='(\w+)'", r"--grammar-backend \1", message)


def _cmd_generate(args: argparse.Namespace, command: str) -> int:
    import torch

    from grammars import GrammarError, grammar_spec
    from grammarspec.completion import complete

    schema = _read_json(args.schema, "--schema") if args.schema else None
    if args.schema and not isinstance(schema, (dict, bool)):
        raise cli_common.CliError(
            f"--schema {args.schema}: the file is valid JSON but holds a {type(schema).__name__}; a JSON Schema "
            'must be an object (such as {"type": "object"}) or a boolean'
        )
    tools = _load_tools(args.tools) if args.tools else None
    if args.parallel_tool_calls and tools is None:
        raise cli_common.CliError("--parallel-tool-calls needs --tools FILE")
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise cli_common.CliError("--prompt is empty: give the model something to answer")
    if args.assistant == "draft_model" and not args.draft_model:
        raise cli_common.CliError("--assistant draft_model needs --draft-model DIR")
    if args.draft_model and args.assistant not in ("auto", "draft_model"):
        raise cli_common.CliError(f"--draft-model is used by --assistant auto or draft_model, not {args.assistant}")
    try:  # check the schema or tools before spending time on the model
        grammar_spec(schema=schema, tools=tools, parallel_tool_calls=args.parallel_tool_calls)
    except GrammarError as e:
        raise cli_common.CliError(
            f"{'--schema ' + args.schema if schema is not None else '--tools ' + args.tools}: {_cli_words(str(e))}"
        ) from None
    cli_common.quiet_transformers()
    model, tokenizer = cli_common.load(args.model)
    assistant: Any = None if args.assistant == "none" else args.assistant
    if args.draft_model:
        draft, _ = cli_common.load(args.draft_model, "--draft-model")
        assistant = draft if args.assistant == "draft_model" else ["auto", draft]
    sampling: dict[str, Any] = {"do_sample": False}
    if args.temperature > 0:
        sampling = {"do_sample": True, "temperature": args.temperature, "top_k": 0, "top_p": 1.0}
    torch.manual_seed(args.seed)
    try:
        result = complete(
            model,
            tokenizer,
            prompt,
            system=args.system,
            schema=schema,
            tools=tools,
            parallel_tool_calls=args.parallel_tool_calls,
            assistant=assistant,
            max_new_tokens=args.max_new_tokens,
            grammar_backend=args.grammar_backend,
            **sampling,
        )
    except GrammarError as e:
        source = f"--schema {args.schema}" if schema is not None else f"--tools {args.tools}"
        raise cli_common.CliError(f"{source}: {_cli_words(str(e))}") from None
    except (ValueError, TypeError) as e:
        print(f"grammarspec generate: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps(
                {
                    "text": result.text,
                    "value": result.value,
                    "valid": result.valid,
                    "finish_reason": result.finish_reason,
                    "errors": result.errors,
                    "stats": result.stats.as_dict(),
                },
                ensure_ascii=False,
                indent=2,
            )
        )
    else:
        print(result.text)
        print(result.stats.summary(), file=sys.stderr)
    if result.valid:
        return 0
    if result.finish_reason == "length":
        print(
            f"grammarspec generate: the answer was cut at {args.max_new_tokens} tokens and is incomplete; "
            "raise --max-new-tokens",
            file=sys.stderr,
        )
    else:
        print(
            f"grammarspec generate: the answer is not valid: {'; '.join(result.errors) or result.finish_reason}",
            file=sys.stderr,
        )
    return 1


# --- bench ----------------------------------------------------------------------------


def _progress_bar(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="bench", unit="run", dynamic_ncols=True, file=sys.stderr)


def _bench_tasks(args: argparse.Namespace, limit: int | None) -> list[Any]:
    from grammarspec.bench.tasks import TaskFileError, default_tasks_path, load_schema_corpus, load_tasks, select_tasks

    task_files = list(args.tasks or [])
    if not task_files and not args.schemas:
        default = default_tasks_path()
        if not default.is_file():
            raise cli_common.CliError(
                f"the default task file {default} does not exist; pass --tasks FILE or --schemas DIR "
                "(or set GRAMMARSPEC_TASKS)"
            )
        task_files = [str(default)]
    tasks = []
    try:
        for file in task_files:
            tasks += load_tasks(file)
        for corpus in args.schemas or []:
            if not Path(corpus).exists():
                raise TaskFileError(f"--schemas {corpus}: no such file or folder")
            tasks += load_schema_corpus(corpus)
        categories = cli_common.split_names(args.categories) or None
        chosen = select_tasks(tasks, categories, limit)
    except TaskFileError as e:
        raise cli_common.CliError(str(e)) from None
    if not chosen:
        raise cli_common.CliError("no tasks to run: the inputs are empty")
    return chosen


def _cmd_bench(args: argparse.Namespace, command: str) -> int:
    from grammarspec.bench.arms import DEFAULT_ARMS, DRAFT_ARMS, check_arms

    if args.tokenizers:
        return _cmd_bench_families(args, command)
    quick: dict[str, Any] = QUICK if args.quick else {}
    limit = args.limit or quick.get("limit")
    arm_list = args.arms or quick.get("arms")
    max_new = args.max_new_tokens or quick.get("max_new_tokens") or BENCH_MAX_NEW_TOKENS
    if arm_list:
        names = cli_common.split_names(arm_list)
    else:
        names = list(DEFAULT_ARMS) + (list(DRAFT_ARMS) if args.draft_model else [])
    try:
        arms = check_arms(names, draft_model_given=bool(args.draft_model))
    except ValueError as e:
        raise cli_common.CliError(f"--arms: {e}") from None
    tasks = _bench_tasks(args, limit)
    out = cli_common.out_folder(args.out)
    if args.batch_size:
        return _cmd_batch_bench(args, command, tasks, out, max_new)
    if not args.no_plots:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise cli_common.CliError(
                "the plots need matplotlib: pip install 'grammarspec[bench]' (or pass --no-plots)"
            )

    from grammarspec.bench.report import write_results
    from grammarspec.bench.runner import BenchConfig, run_bench

    cli_common.quiet_transformers()
    model, tokenizer = cli_common.load(args.model)
    draft = cli_common.load(args.draft_model, "--draft-model")[0] if args.draft_model else None
    config = BenchConfig(
        arms=tuple(arms),
        max_new_tokens=max_new,
        temperature=args.temperature,
        seed=args.seed,
        repeat=args.repeat,
        model=args.model,
        draft_model=args.draft_model,
    )
    progress = None if args.no_progress else _progress_bar
    print(
        f"grammarspec bench: {len(tasks)} tasks x {len(arms)} arms ({', '.join(arms)}) x {args.repeat} repeat(s), "
        f"max_new_tokens {max_new}",
        file=sys.stderr,
    )
    cli_common.warn_if_busy()
    result = run_bench(model, tokenizer, tasks, config, draft_model=draft, progress=progress)
    paths = write_results(result, out, command=command, plots=not args.no_plots)
    markdown = paths["markdown"].read_text(encoding="utf-8")
    print(markdown.split("### Details per category")[0].rstrip())
    print(f"\nwrote {', '.join(str(p) for p in paths.values())} in {result.wall_seconds:.0f}s", file=sys.stderr)
    failures = sum("error" in r for r in result.runs)
    if failures:
        print(f"grammarspec bench: {failures} run(s) failed; see {paths['markdown']}", file=sys.stderr)
    return 0


def _cmd_bench_families(args: argparse.Namespace, command: str) -> int:
    """``bench --tokenizers DIR``: tokens per pass of a scripted canonical target, per tokenizer family."""
    from grammarspec.bench.families import family_files, load_family_tokenizer, run_family, to_markdown
    from grammarspec.model.loading import load_tokenizer
    from proposers.presets import PRESETS

    model_free = [p for p in PRESETS if p != "draft_model"]
    assistant = (args.arms or "auto").split(",")[0].strip()
    if assistant not in model_free:
        raise cli_common.CliError(f"--arms {args.arms}: with --tokenizers give one of {', '.join(model_free)}")
    try:
        files = family_files(args.tokenizers)
    except ValueError as e:
        raise cli_common.CliError(str(e)) from None
    tasks = _bench_tasks(args, args.limit)
    cli_common.quiet_transformers()
    families: list[tuple[str, str | Path]] = [(Path(args.model).name, args.model)]
    families += [(f.stem.removeprefix("ggml-vocab-"), f) for f in files]
    results = []
    for name, source in families:
        try:
            tokenizer = load_family_tokenizer(source) if isinstance(source, Path) else load_tokenizer(source)
        except Exception as e:  # noqa: BLE001 - a file transformers cannot read is reported, the rest still run
            reason = f"{type(e).__name__}: {str(e)[:160]}"
            print(f"grammarspec bench: {name}: transformers cannot load it ({reason})", file=sys.stderr)
            continue
        print(f"grammarspec bench: {name} ({len(tokenizer):,} tokens), {len(tasks)} tasks", file=sys.stderr)
        results.append(run_family(name, tokenizer, tasks, assistant=assistant))
    table = to_markdown(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "families.md").write_text(f"`{command}`\n\n{table}\n", encoding="utf-8")
    (out / "families.json").write_text(json.dumps([r.as_dict() for r in results], indent=1), encoding="utf-8")
    print(table)
    return 0


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise cli_common.CliError(
            f"--batch-size: expected whole numbers separated by commas (e.g. 1,4,8), got {text!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise cli_common.CliError(f"--batch-size: every batch size must be >= 1, got {text!r}")
    return sizes


def _cmd_batch_bench(args: argparse.Namespace, command: str, tasks: list[Any], out: Path, max_new: int) -> int:
    from grammarspec.bench.batch import batch_table, run_batch_bench

    sizes = _batch_sizes(args.batch_size)
    if args.temperature:
        raise cli_common.CliError("--batch-size runs greedily (outputs are compared row by row): drop --temperature")
    cli_common.quiet_transformers()
    model, tokenizer = cli_common.load(args.model)
    print(
        f"grammarspec bench --batch-size {args.batch_size}: {len(tasks)} tasks, max_new_tokens {max_new}",
        file=sys.stderr,
    )
    cli_common.warn_if_busy()
    progress = None if args.no_progress else (lambda line: print(line, file=sys.stderr))
    arms = [a for a in args.arms.split(",") if a] if args.arms else None
    unknown = sorted(set(arms or ()) - {"baseline", "none", "auto"})
    if unknown:
        raise cli_common.CliError(f"--batch-size runs the arms baseline, none and auto; not {', '.join(unknown)}")
    if arms is not None and "auto" not in arms:
        raise cli_common.CliError("--batch-size needs the arm auto (the table compares it with the others)")
    runs = run_batch_bench(model, tokenizer, tasks, sizes, max_new, progress=progress, arms=arms)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batch.json").write_text(json.dumps({"command": command, "runs": [r.as_dict() for r in runs]}, indent=1))
    table = batch_table(runs)
    (out / "batch.md").write_text(f"`{command}`\n\n{table}\n", encoding="utf-8")
    if not args.no_plots:
        from grammarspec.bench.plots import plot_batch_throughput

        plot_batch_throughput(runs, out / "batch_throughput.png")
    print(table)
    return 0


def _cmd_bench_agent(args: argparse.Namespace, command: str) -> int:
    """``grammarspec bench-agent`` (see :mod:`grammarspec.bench.agent`)."""
    from dataclasses import asdict

    from grammarspec.bench.agent import agent_markdown, run_agent_bench
    from grammarspec.bench.agent_tasks import CONVERSATIONS

    chosen = cli_common.chosen_conversations(args.conversations, CONVERSATIONS)
    out = cli_common.out_folder(args.out)
    model, tokenizer = cli_common.load_for_timing(args.model)
    runs = run_agent_bench(
        model, tokenizer, conversations=chosen, repeat=args.repeat, progress=lambda line: print(line, file=sys.stderr)
    )
    cli_common.write_report(out, "agent", agent_markdown(runs, command), [asdict(r) for r in runs])
    return 0


if __name__ == "__main__":  # python -m grammarspec.cli.main
    sys.exit(main())
