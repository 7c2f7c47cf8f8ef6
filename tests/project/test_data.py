"""The repository's data sample (data/) and the one loader of task files and schema corpora.

The tests and ``grammarspec bench --quick`` must run from a clone with
nothing beside it: the defaults are inside the repository, the environment
(``GRAMMARSPEC_TASKS`` / ``GRAMMARSPEC_SCHEMAS``) names other inputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grammarspec.bench import tasks as loader
from grammarspec.bench.tasks import (
    TaskFileError,
    default_schemas_path,
    default_tasks_path,
    load_schema_corpus,
    load_tasks,
    read_schema_records,
    read_task_records,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(loader.TASKS_ENV, raising=False)
    monkeypatch.delenv(loader.SCHEMAS_ENV, raising=False)


def test_the_defaults_are_inside_the_repository(no_env):
    assert default_tasks_path() == DATA / "tasks" / "tasks.jsonl"
    assert default_schemas_path() == DATA / "schemas"
    records = read_task_records()
    assert {r["kind"] for r in records} == {"extraction", "tool_call", "generation"}
    assert len(load_tasks()) == len(records)
    corpus = read_schema_records()
    assert len({r["category"] for r in corpus}) == 7  # every category of the full corpus
    assert len(load_schema_corpus()) >= len(corpus)  # function_calling records give one task per prompt


def test_the_environment_names_other_inputs(no_env, tmp_path, monkeypatch):
    task = {"id": "t1", "kind": "extraction", "prompt": "p", "schema": {"type": "object"}, "reference": {}}
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "misc.jsonl").write_text(json.dumps({"schema": {"type": "string"}}) + "\n")
    monkeypatch.setenv(loader.TASKS_ENV, str(tmp_path / "tasks.jsonl"))
    monkeypatch.setenv(loader.SCHEMAS_ENV, str(corpus))
    assert [t.id for t in load_tasks()] == ["t1"]
    assert read_schema_records() == [{"schema": {"type": "string"}, "id": "misc/1", "category": "misc"}]
    monkeypatch.setenv(loader.TASKS_ENV, str(tmp_path / "missing.jsonl"))
    with pytest.raises(TaskFileError, match="missing.jsonl.*GRAMMARSPEC_TASKS"):
        read_task_records()
    monkeypatch.setenv(loader.SCHEMAS_ENV, str(tmp_path / "empty"))
    with pytest.raises(TaskFileError, match="no schema corpus .*GRAMMARSPEC_SCHEMAS"):
        read_schema_records()


def test_categories_are_filtered_and_unknown_ones_named(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"schema": {}}) + "\n" + json.dumps({"schema": {}}) + "\n")
    assert [r["id"] for r in read_schema_records(tmp_path, ["b"])] == ["b/1", "b/2"]
    with pytest.raises(TaskFileError, match="no records of the category z in"):
        read_schema_records(tmp_path, ["b", "z"])
    (tmp_path / "c.jsonl").write_text(json.dumps({"no_schema": 1}) + "\n")
    with pytest.raises(TaskFileError, match=r"c.jsonl:1: a schema corpus record needs a 'schema' object"):
        read_schema_records(tmp_path)


def test_the_sample_is_small_and_carries_its_sources_and_licenses():
    files = [p for p in DATA.rglob("*") if p.is_file() and "tokenizers" not in p.relative_to(DATA).parts]
    assert sum(p.stat().st_size for p in files) < 1_000_000
    # the vocabularies the tokenizer-family tests need (two SentencePiece files), with their license and source
    vocabularies = [p for p in (DATA / "tokenizers").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in vocabularies) < 2_000_000
    assert {"LICENSE.llama.cpp", "README.md"} <= {p.name for p in vocabularies}
    schemas = DATA / "schemas"
    assert {p.name for p in (schemas / "LICENSES").iterdir()} >= {
        "Apache-2.0.txt",
        "MIT-JSONSchemaBench.txt",
        "NOTICE-SchemaStore.txt",
    }
    readme = (schemas / "README.md").read_text()
    assert "How the sample was chosen" in readme and "Sources and licenses" in readme
    assert (DATA / "tasks" / "README.md").is_file()
    for record in read_schema_records(schemas):
        assert record["id"].startswith(record["category"] + "/") and ":" in record["source"], record["id"]


def test_nothing_reads_a_folder_beside_the_checkout():
    """Tests, tools and the package name no ../shared (the repository is self-contained)."""
    offenders = []
    for folder in ("grammarspec", "grammars", "proposers", "tools", "tests", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == Path(__file__).resolve():
                continue
            text = path.read_text(encoding="utf-8")
            if "../shared" in text or '"shared" /' in text or 'parent / "shared"' in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == [], offenders
