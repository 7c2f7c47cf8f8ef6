"""Benchmark inputs: task files and schema corpora, as one list of :class:`BenchTask`.

Two input formats (see ``data/tasks/README.md`` and ``data/schemas/README.md``):

* **task files** (``tasks.jsonl``): one task per line with ``id``, ``kind``
  (the category), optional ``system``, ``prompt``, ``schema`` and/or ``tools``
  and a ``reference`` answer;
* **schema corpora** (``<category>.jsonl``): one production schema per line.
  Each record becomes one task whose prompt is generated from the schema
  (:func:`schema_prompt`); a ``function_calling`` record instead becomes one
  task per stored prompt (the BFCL user turn), whose reference is the single
  ground-truth call when there is one.

The grammar of a task is its ``schema`` when it has one (a tool-call task's
schema already encodes the tool choice), else the call schema grammarspec
builds from its ``tools``.  The prompt text is the same for every arm.

This module is the one loader of both formats: the bench, the tests and the
developer tools (``tools/``) read task files and schema corpora through
:func:`read_task_records` / :func:`read_schema_records` (the records as
stored) or :func:`load_tasks` / :func:`load_schema_corpus` (as
:class:`BenchTask`).  Defaults: the sample shipped in the repository's
``data/`` folder (the whole task file, 41 of the 420 production schemas),
unless ``$GRAMMARSPEC_TASKS`` / ``$GRAMMARSPEC_SCHEMAS`` name other ones
(the full corpus, say).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grammars import tools_schema

__all__ = [
    "BenchTask",
    "TaskFileError",
    "default_tasks_path",
    "default_schemas_path",
    "read_task_records",
    "read_schema_records",
    "load_tasks",
    "load_schema_corpus",
    "schema_prompt",
    "select_tasks",
    "SCORED_CATEGORIES",
]

#: Categories whose reference is a gold answer (field accuracy is computed for these).
SCORED_CATEGORIES = frozenset({"extraction", "tool_call", "function_calling"})

#: A schema longer than this (compact JSON characters) is summarised in the
#: prompt instead of quoted in full, to keep prompts well inside the context.
MAX_QUOTED_SCHEMA_CHARS = 6000


class TaskFileError(ValueError):
    """A task file or schema corpus is missing or malformed."""


@dataclass(frozen=True)
class BenchTask:
    """One prompt + grammar to run under every arm.

    ``prompt``: the user message, or a list of chat messages.
    ``schema``: the JSON Schema the output must follow (the grammar).
    ``tools``: tool definitions shown to the model in the prompt (tool calls only).
    ``describe_schema``: whether the prompt quotes ``schema`` (build_prompt's ``describe``).
    ``reference``: a gold answer (``None`` when there is none); ``scored``
    says whether field accuracy against it means anything.
    """

    id: str
    category: str
    prompt: str | list[dict[str, str]]
    schema: dict[str, Any]
    system: str | None = None
    tools: list[dict[str, Any]] | None = None
    describe_schema: bool = True
    reference: Any = None
    scored: bool = False
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


#: The repository's data folder: a small curated sample (see data/README.md).
DATA_DIR = Path(__file__).resolve().parents[2] / "data"
#: Environment variables naming other inputs (the full corpus, say) than the in-repository sample.
TASKS_ENV = "GRAMMARSPEC_TASKS"
SCHEMAS_ENV = "GRAMMARSPEC_SCHEMAS"


def default_tasks_path() -> Path:
    """``$GRAMMARSPEC_TASKS`` if set, else the repository's ``data/tasks/tasks.jsonl``."""
    return Path(os.environ[TASKS_ENV]) if os.environ.get(TASKS_ENV) else DATA_DIR / "tasks" / "tasks.jsonl"


def default_schemas_path() -> Path:
    """``$GRAMMARSPEC_SCHEMAS`` if set, else the repository's ``data/schemas`` (a sample of the corpus)."""
    return Path(os.environ[SCHEMAS_ENV]) if os.environ.get(SCHEMAS_ENV) else DATA_DIR / "schemas"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise TaskFileError(f"no such file: {path}")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFileError(f"{path}:{number}: not valid JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(record, dict):
            raise TaskFileError(f"{path}:{number}: expected a JSON object per line, got {type(record).__name__}")
        records.append(record)
    return records


def read_task_records(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The records of a task file as stored (default: :func:`default_tasks_path`).

    Raises :class:`TaskFileError` naming the file (and line) when it is missing or malformed.
    """
    path = Path(path) if path is not None else default_tasks_path()
    if not path.is_file():
        raise TaskFileError(
            f"no such file: {path} (a task file is given by --tasks FILE or ${TASKS_ENV}; "
            "the repository's own is data/tasks/tasks.jsonl)"
        )
    return _read_jsonl(path)


def _corpus_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path] if path.is_file() else []
    if not files:
        raise TaskFileError(f"no schema corpus (*.jsonl) at {path}: pass --schemas DIR or set ${SCHEMAS_ENV}")
    return files


def _corpus_file_records(file: Path) -> list[dict[str, Any]]:
    records = _read_jsonl(file)
    for number, record in enumerate(records, start=1):
        if not isinstance(record.get("schema"), dict):
            raise TaskFileError(f"{file}:{number}: a schema corpus record needs a 'schema' object")
        record.setdefault("id", f"{file.stem}/{number}")
        record.setdefault("category", file.stem)
    return records


def read_schema_records(
    path: str | Path | None = None, categories: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """The records of a schema corpus as stored: one ``.jsonl`` file or a folder of them (sorted).

    ``path`` defaults to :func:`default_schemas_path`.  A record without an
    ``id`` or ``category`` gets ``<file stem>/<line>`` and the file stem.
    ``categories`` keeps only those (each must have records).  Raises
    :class:`TaskFileError` for a missing or malformed corpus.
    """
    path = Path(path) if path is not None else default_schemas_path()
    wanted = list(dict.fromkeys(categories)) if categories is not None else None
    records = [
        record
        for file in _corpus_files(path)
        for record in _corpus_file_records(file)
        if wanted is None or record["category"] in wanted
    ]
    if wanted is not None:
        missing = [c for c in wanted if c not in {r["category"] for r in records}]
        if missing:
            raise TaskFileError(
                f"no records of the categor{'y' if len(missing) == 1 else 'ies'} {', '.join(missing)} in {path}"
            )
    return records


def load_tasks(path: str | Path | None = None) -> list[BenchTask]:
    """Tasks of a task file in the ``tasks.jsonl`` format (default: :func:`default_tasks_path`).

    Raises :class:`TaskFileError` naming the file, line and missing field.
    """
    path = Path(path) if path is not None else default_tasks_path()
    tasks = []
    for number, record in enumerate(read_task_records(path), start=1):
        where = f"{path} (task {record.get('id', number)!r})"
        if not isinstance(record.get("prompt"), (str, list)):
            raise TaskFileError(f"{where}: needs a 'prompt' (the user message)")
        tools = record.get("tools")
        schema = record.get("schema")
        if schema is None and tools is None:
            raise TaskFileError(f"{where}: needs a 'schema' or 'tools' to constrain the output")
        parallel = isinstance(record.get("reference"), list) and tools is not None
        if schema is None:
            assert tools is not None  # refused above otherwise
            schema = tools_schema(tools, parallel=parallel)
        category = str(record.get("kind") or record.get("category") or "tasks")
        tasks.append(
            BenchTask(
                id=str(record.get("id", f"task-{number}")),
                category=category,
                prompt=record["prompt"],
                schema=schema,
                system=record.get("system"),
                tools=tools,
                describe_schema=tools is None,
                reference=record.get("reference"),
                scored=category in SCORED_CATEGORIES and "reference" in record,
                source=str(path),
            )
        )
    return tasks


def schema_prompt(schema: dict[str, Any]) -> tuple[str, bool]:
    """A user prompt asking for one realistic document of ``schema``.

    Returns ``(prompt, quote_schema)``: small schemas are quoted in the system
    prompt by ``build_prompt`` (``quote_schema`` True); larger ones are
    summarised here by title, description and top-level property names.  Pure.

    >>> schema_prompt({"title": "Point", "type": "object", "properties": {"x": {}, "y": {}}})[0]
    'Write one realistic example of a JSON document: Point. Reply with the JSON only.'
    """
    compact = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    title = schema.get("title") if isinstance(schema.get("title"), str) else None
    description = schema.get("description") if isinstance(schema.get("description"), str) else None
    what = title or description or "a document that follows the schema"
    prompt = f"Write one realistic example of a JSON document: {what.strip().rstrip('.')}."
    if len(compact) <= MAX_QUOTED_SCHEMA_CHARS:
        return prompt + " Reply with the JSON only.", True
    if title and description:
        prompt += f" ({description.strip()[:300]})"
    properties = schema.get("properties")
    if isinstance(properties, dict) and properties:
        prompt += " Its top-level fields are: " + ", ".join(list(properties)[:40]) + "."
    return prompt + " Reply with the JSON only.", False


def _function_tasks(record: dict[str, Any], where: str) -> list[BenchTask]:
    tool = record.get("tool") or {}
    name = tool.get("name", "the function")
    system = (
        f"You call the function {name}: {str(tool.get('description', '')).strip()} "
        "Reply with the call's arguments as one JSON object."
    )
    tasks = []
    for i, entry in enumerate(record.get("prompts") or []):
        truth = entry.get("ground_truth") or []
        reference = truth[0] if len(truth) == 1 else None
        tasks.append(
            BenchTask(
                id=f"{record['id']}#{i}",
                category=record.get("category", "function_calling"),
                prompt=list(entry["messages"]),
                schema=record["schema"],
                system=system,
                describe_schema=True,
                reference=reference,
                scored=reference is not None,
                source=where,
            )
        )
    return tasks


def load_schema_corpus(path: str | Path | None = None) -> list[BenchTask]:
    """Tasks from a schema corpus: one ``.jsonl`` file or a folder of them (see :func:`read_schema_records`).

    A ``function_calling`` record gives one task per stored prompt; any other
    record gives one task with a prompt generated by :func:`schema_prompt`
    and no reference.
    """
    tasks: list[BenchTask] = []
    for file in _corpus_files(Path(path) if path is not None else default_schemas_path()):
        for record in _corpus_file_records(file):
            if record.get("prompts"):
                tasks += _function_tasks(record, str(file))
                continue
            prompt, quote = schema_prompt(record["schema"])
            tasks.append(
                BenchTask(
                    id=str(record["id"]),
                    category=str(record["category"]),
                    prompt=prompt,
                    schema=record["schema"],
                    describe_schema=quote,
                    source=str(file),
                )
            )
    return tasks


def select_tasks(
    tasks: Sequence[BenchTask], categories: Iterable[str] | None = None, limit: int | None = None
) -> list[BenchTask]:
    """Filter by category, then keep at most ``limit`` tasks taken round-robin over categories.

    Round-robin keeps a limited run representative: ``limit=3`` over
    categories a, a, b, c gives the first a, b and c.  Categories keep their
    first-seen order.  Raises :class:`TaskFileError` for an unknown category.

    >>> ts = [BenchTask(str(i), c, "p", {}) for i, c in enumerate("aabc")]
    >>> [t.id for t in select_tasks(ts, limit=3)]
    ['0', '2', '3']
    """
    chosen = list(tasks)
    if categories is not None:
        wanted = list(dict.fromkeys(categories))
        known = list(dict.fromkeys(t.category for t in tasks))
        unknown = [c for c in wanted if c not in known]
        if unknown:
            raise TaskFileError(
                f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                f"the inputs have: {', '.join(known)}"
            )
        chosen = [t for t in chosen if t.category in wanted]
    if limit is None or limit >= len(chosen):
        return chosen
    groups: dict[str, list[BenchTask]] = {}
    for task in chosen:
        groups.setdefault(task.category, []).append(task)
    picked: list[BenchTask] = []
    depth = 0
    while len(picked) < limit:
        for group in groups.values():
            if depth < len(group) and len(picked) < limit:
                picked.append(group[depth])
        depth += 1
    order = {id(t): i for i, t in enumerate(chosen)}
    return sorted(picked, key=lambda t: order[id(t)])
