"""The grammarspec command line: clear argument errors, and generate/bench on the real model."""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammarspec.cli import common as cli_common
from grammarspec.cli import main as cli

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture
def schema_file(tmp_path):
    path = tmp_path / "person.json"
    path.write_text(json.dumps(PERSON))
    return str(path)


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a command loads a model (argument errors must come first)."""

    def refuse(name, what="--model", **placement):
        raise AssertionError("the model was loaded although the arguments were wrong")

    monkeypatch.setattr(cli_common, "load", refuse)


def _exit(argv, capsys):
    """Run the CLI; returns (status, stderr).  argparse errors raise SystemExit."""
    try:
        status = cli.main(argv)
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["generate", "--prompt", "hi"], "one of the arguments --schema --tools is required"),
        (["generate", "--schema", "a.json", "--tools", "b.json", "--prompt", "hi"], "not allowed with argument"),
        (["generate", "--schema", "a.json"], "the following arguments are required: --prompt"),
        (["generate", "--schema", "a.json", "--prompt", "hi", "--temperature", "-1"], "must be >= 0"),
        (["generate", "--schema", "a.json", "--prompt", "hi", "--max-new-tokens", "0"], "must be >= 1"),
        (["generate", "--schema", "a.json", "--prompt", "hi", "--assistant", "fast"], "invalid choice: 'fast'"),
        (["bench", "--repeat", "two"], "expected a whole number, got 'two'"),
    ],
)
def test_argument_errors_exit_2_with_a_clear_message(argv, message, capsys, no_model):
    status, err = _exit(argv, capsys)
    assert status == 2
    assert message in err


def test_generate_input_errors_name_the_file(tmp_path, schema_file, capsys, no_model):
    status, err = _exit(["generate", "--schema", str(tmp_path / "missing.json"), "--prompt", "hi"], capsys)
    assert status == 2 and "--schema" in err and "missing.json: no such file" in err
    broken = tmp_path / "broken.json"
    broken.write_text('{"type": "object",\n  "properties": }')
    status, err = _exit(["generate", "--schema", str(broken), "--prompt", "hi"], capsys)
    assert status == 2 and "is not valid JSON" in err and "line 2" in err
    bad_schema = tmp_path / "bad.json"
    bad_schema.write_text('{"type": 5}')
    status, err = _exit(["generate", "--schema", str(bad_schema), "--prompt", "hi"], capsys)
    assert status == 2 and "not a valid JSON Schema" in err
    empty_tools = tmp_path / "tools.json"
    empty_tools.write_text("[]")
    status, err = _exit(["generate", "--tools", str(empty_tools), "--prompt", "hi"], capsys)
    assert status == 2 and "non-empty list of tool definitions" in err
    status, err = _exit(["generate", "--schema", schema_file, "--prompt", "  "], capsys)
    assert status == 2 and "--prompt is empty" in err


def test_generate_option_combinations(schema_file, capsys, no_model):
    status, err = _exit(["generate", "--schema", schema_file, "--prompt", "hi", "--assistant", "draft_model"], capsys)
    assert status == 2 and "needs --draft-model DIR" in err
    status, err = _exit(["generate", "--schema", schema_file, "--prompt", "hi", "--parallel-tool-calls"], capsys)
    assert status == 2 and "--parallel-tool-calls needs --tools" in err
    status, err = _exit(
        ["generate", "--schema", schema_file, "--prompt", "hi", "--assistant", "none", "--draft-model", "d"], capsys
    )
    assert status == 2 and "--draft-model is used by --assistant auto or draft_model" in err


def test_unknown_model_is_reported_without_a_traceback(schema_file, capsys):
    status, err = _exit(
        ["generate", "--schema", schema_file, "--prompt", "hi", "--model", "/nonexistent/model"], capsys
    )
    assert status == 2
    assert "--model: No model at '/nonexistent/model'" in err and "Traceback" not in err


def test_bench_argument_errors(tmp_path, capsys, no_model):
    status, err = _exit(["bench", "--arms", "none,turbo"], capsys)
    assert status == 2 and "unknown arm turbo" in err and "schema_ngram" in err
    status, err = _exit(["bench", "--arms", "draft_model"], capsys)
    assert status == 2 and "needs a draft model: pass --draft-model DIR" in err
    status, err = _exit(["bench", "--categories", "poetry"], capsys)
    assert status == 2 and "unknown category poetry; the inputs have: extraction, tool_call, generation" in err
    status, err = _exit(["bench", "--tasks", str(tmp_path / "none.jsonl")], capsys)
    assert status == 2 and "none.jsonl" in err and "no such file" in err
    status, err = _exit(["bench", "--schemas", str(tmp_path / "corpus")], capsys)
    assert status == 2 and "--schemas" in err and "no such file or folder" in err


# --- the real model ----------------------------------------------------------------------


@pytest.fixture
def smol_cli(smol, monkeypatch):
    """The CLI, loading the session's model instead of a fresh copy."""
    monkeypatch.setattr(cli_common, "load", lambda name, what="--model", **placement: smol)
    return smol


@pytest.mark.slow
def test_generate_prints_valid_json_and_statistics(smol_cli, schema_file, capsys):
    status = cli.main(
        ["generate", "--schema", schema_file, "--prompt", "Ada Lovelace is 36 years old.", "--max-new-tokens", "40"]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    jsonschema.validate(json.loads(out), PERSON)
    assert "target forward passes" in err and "finish: stop" in err


@pytest.mark.slow
def test_generate_json_output_for_a_tool_call(smol_cli, tmp_path, capsys):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps({"tools": [WEATHER_TOOL]}))
    status = cli.main(
        [
            "generate",
            "--tools",
            str(tools),
            "--prompt",
            "What is the weather in Oslo?",
            "--assistant",
            "none",
            "--max-new-tokens",
            "40",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert status == 0, err
    assert result["valid"] is True and result["value"]["name"] == "get_weather"
    assert result["stats"]["new_tokens"] > 0 and result["stats"]["proposed"] == {}  # no speculation


@pytest.mark.slow
def test_generate_cut_by_the_token_limit_says_so(smol_cli, schema_file, capsys):
    status = cli.main(["generate", "--schema", schema_file, "--prompt", "Ada, 36", "--max-new-tokens", "3"])
    err = capsys.readouterr().err
    assert status == 1 and "raise --max-new-tokens" in err


@pytest.mark.slow
def test_bench_quick_style_run_writes_every_output(smol_cli, tmp_path, capsys):
    out = tmp_path / "bench"
    status = cli.main(
        [
            "bench",
            "--quick",
            "--categories",
            "tool_call",
            "--limit",
            "1",
            "--max-new-tokens",
            "6",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    stdout = capsys.readouterr().out
    assert status == 0
    assert "| tool_call | 1 |" in stdout
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["arms"] == ["baseline", "none", "auto"] and data["config"]["max_new_tokens"] == 6
    assert {r["arm"] for r in data["runs"]} == {"baseline", "none", "auto"}
    fields = {
        "tokens_per_second",
        "accepted_per_forward",
        "acceptance",
        "forced_fraction",
        "grammar_us_per_token",
        "draft_ms_per_forward",
        "verify_ms_per_forward",
        "valid",
        "agreement",
        "field_accuracy",
        "speedup",
    }
    assert fields <= set(data["summary"]["categories"]["tool_call"]["auto"])
    assert "### Details per category and arm" in (out / "results.md").read_text()
    for png in ("speedup.png", "accepted_per_step.png", "acceptance_vs_length.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


# --- compile errors: the CLI's own flag and the file it read ------------------------------------------


@pytest.fixture
def toy_cli(monkeypatch):
    from tests.toy import toy_tokenizer, toy_vocab_size
    from tests.toy_models import tiny_llama

    tok = toy_tokenizer()
    monkeypatch.setattr(
        cli_common, "load", lambda name, what="--model", **placement: (tiny_llama(toy_vocab_size(), seed=0), tok)
    )


def test_compile_error_names_the_file_and_the_cli_flag(tmp_path, capsys, toy_cli):
    path = tmp_path / "hostname.json"
    # outlines-core refuses it, xgrammar compiles it
    path.write_text(json.dumps({"type": "string", "format": "hostname"}))
    status, err = _exit(["generate", "--schema", str(path), "--prompt", "hi", "--grammar-backend", "outlines"], capsys)
    assert status == 2 and f"--schema {path}" in err
    assert "--grammar-backend xgrammar" in err and "backend='" not in err


def test_unsatisfiable_schema_suggests_no_other_backend(tmp_path, capsys, toy_cli):
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"type": "integer", "minimum": 5, "maximum": 2}))
    status, err = _exit(["generate", "--schema", str(path), "--prompt", "hi"], capsys)
    assert status == 2 and f"--schema {path}" in err and "accepts no value" in err
    assert "outlines" not in err and "--grammar-backend" not in err


def test_serve_passes_its_prompt_chunk_to_the_engine(capsys, toy_cli, monkeypatch):
    import grammarspec.serve as serving

    started = []
    monkeypatch.setattr(serving, "serve", lambda engine, name, **kwargs: (started.append(engine), engine.close()))
    assert _exit(["serve", "--prompt-chunk", "16"], capsys)[0] == 0
    assert _exit(["serve"], capsys)[0] == 0
    assert [engine.prompt_chunk for engine in started] == [16, None]  # None: derived from the pass cost
    status, err = _exit(["serve", "--prompt-chunk", "0"], capsys)
    assert status == 2 and "--prompt-chunk" in err and "must be >= 1" in err


@pytest.mark.parametrize("command", [["serve"], ["bench-serve", "--sweep"], ["bench-serve"]])
def test_a_device_this_machine_lacks_is_refused_before_loading(command, capsys, monkeypatch):
    import torch

    from grammarspec.model import loading

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loading, "_resolve", lambda name: pytest.fail("the model was looked up"))
    status, err = _exit([*command, "--device", "cuda"], capsys)
    assert status == 2 and "--device" in err and "sees no cuda device" in err and "Traceback" not in err
    status, err = _exit([*command, "--device", "gpu0"], capsys)
    assert status == 2 and "'gpu0' is not a torch device name" in err
    status, err = _exit([*command, "--dtype", "float64"], capsys)
    assert status == 2 and "invalid choice: 'float64'" in err


def test_serve_loads_the_model_on_the_device_and_dtype_asked(capsys, monkeypatch):
    import torch

    import grammarspec.serve as serving

    started = []
    monkeypatch.setattr(serving, "serve", lambda engine, name, **kwargs: (started.append(engine), engine.close()))
    assert _exit(["serve", "--dtype", "bfloat16", "--device", "cpu"], capsys)[0] == 0
    parameter = next(started[0].model.parameters())
    assert parameter.dtype == torch.bfloat16 and parameter.device.type == "cpu"
    assert _exit(["serve"], capsys)[0] == 0  # the defaults: float32 on the CPU
    assert next(started[1].model.parameters()).dtype == torch.float32


def test_transformers_serve_runs_on_the_models_device_and_dtype(monkeypatch, tmp_path):
    import torch

    from grammarspec.bench import servers
    from tests.toy_models import tiny_llama

    commands = []
    monkeypatch.setattr(servers, "Subprocess", lambda cmd, env, what, timeout: commands.append(cmd(8123)))
    model = tiny_llama(32, seed=0).to(torch.bfloat16)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text("{}")
    servers.start_transformers_serve(model, str(tmp_path / "src"), str(tmp_path))
    command = commands[0]
    assert command[command.index("--device") + 1] == "cpu"
    assert command[command.index("--dtype") + 1] == "bfloat16"
