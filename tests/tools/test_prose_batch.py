"""tools/prose_batch.py: free prose in one static batch, as BENCHMARKS.md quotes it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.helpers import load_tool


def test_a_static_batch_reports_its_passes_and_draft_counts(smol, monkeypatch):
    tool = load_tool("prose_batch")
    readings = iter([100.0, 101.5, 200.0, 202.5])  # the tool's clock, read before and after each batch
    monkeypatch.setattr(tool, "time", SimpleNamespace(perf_counter=lambda: next(readings)))
    model, tokenizer = smol
    side = tokenizer.padding_side
    inputs = tool.batch_inputs(tokenizer, 3)
    assert inputs["input_ids"].shape[0] == 3 and int(inputs["attention_mask"][:, 0].sum()) < 3  # left-padded
    assert bool(inputs["attention_mask"][:, -1].all())  # every row's prompt ends at the last column
    assert tokenizer.padding_side == side  # the caller's tokenizer is left as it was
    plain = tool.run(model, tokenizer, 2, "none", 6)
    drafted = tool.run(model, tokenizer, 2, "auto", 6)
    assert plain["passes"] == 6 and plain["proposed"] == 0 and plain["drafted"] == 0 and plain["tokens"] == 12
    assert drafted["drafted"] <= drafted["passes"] and (drafted["drafted"] > 0) == (drafted["proposed"] > 0)
    assert drafted["tokens"] == 12 and drafted["accepted"] <= drafted["proposed"]
    assert (plain["seconds"], drafted["seconds"]) == (1.5, 2.5)  # each batch's generate, between two readings


def test_bad_arguments_are_refused(capsys):
    tool = load_tool("prose_batch")
    with pytest.raises(SystemExit) as stop:  # --batch-sizes 0 is refused
        tool.main(["--batch-sizes", "0"])
    assert stop.value.code == 2
    assert "--batch-sizes" in capsys.readouterr().err
