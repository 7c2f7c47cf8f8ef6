"""Agent frameworks against a real ``grammarspec serve`` process: LangChain and the OpenAI Agents SDK.

Each test runs the README's snippet for its framework as written (only the
base URL points at this module's server): a two-step tool agent, where a named
``tool_choice`` forces the first step to call the tool, the framework parses
the call and runs the tool, and the second step answers from the tool's
result.  The assertions are on the protocol as the framework sees it; the
embedded SmolLM2-135M answers greedily, so the run is deterministic.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("uvicorn")
from tests.serve_process import readme_block, serve_process

pytestmark = pytest.mark.slow

RESULT = "Sunny, 21 C in "  # what the snippets' get_weather returns, before the city


@pytest.fixture(scope="module")
def server():
    with serve_process("--max-tokens", "128") as (url, _pid):
        yield url


def _run_snippet(server: str, starts: str) -> dict:
    code = readme_block("## Serving", starts).replace("http://127.0.0.1:8000/v1", server + "/v1")
    namespace: dict = {"__name__": "readme_snippet"}
    exec(compile(code, "README.md", "exec"), namespace)
    return namespace


def test_langchain_bind_tools_agent(server, capsys):
    from langchain_core.messages import AIMessage, ToolMessage

    ran = _run_snippet(server, "from langchain_core")
    call, messages, answer = ran["call"], ran["messages"], ran["answer"]
    assert isinstance(call, AIMessage) and call.response_metadata["finish_reason"] == "tool_calls"
    assert not call.invalid_tool_calls and [c["name"] for c in call.tool_calls] == ["get_weather"]
    city = call.tool_calls[0]["args"]["city"]
    assert isinstance(city, str) and set(call.tool_calls[0]["args"]) == {"city"}
    result = messages[-1]
    assert isinstance(result, ToolMessage) and result.tool_call_id == call.tool_calls[0]["id"]
    assert result.content == RESULT + city  # the tool ran on the parsed arguments
    assert isinstance(answer, AIMessage) and not answer.tool_calls
    assert answer.response_metadata["finish_reason"] == "stop" and answer.content
    assert "Sunny" in answer.content  # the answer reads the tool's result (greedy: the model copies it)
    assert capsys.readouterr().out.strip() == answer.content.strip()


def test_openai_agents_sdk_agent(server, capsys):
    from agents import MessageOutputItem, ToolCallItem, ToolCallOutputItem

    result = _run_snippet(server, "import openai\nfrom agents")["result"]
    kinds = [type(item) for item in result.new_items]
    assert kinds == [ToolCallItem, ToolCallOutputItem, MessageOutputItem]  # call, tool run, answer
    call, output, _ = result.new_items
    assert call.raw_item.name == "get_weather"
    arguments = json.loads(call.raw_item.arguments)
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
    assert output.raw_item["call_id"] == call.raw_item.call_id and output.output == RESULT + arguments["city"]
    assert len(result.raw_responses) == 2  # two model calls, each a valid Chat Completions reply
    assert isinstance(result.final_output, str) and "Sunny" in result.final_output
    assert capsys.readouterr().out.strip() == result.final_output.strip()
