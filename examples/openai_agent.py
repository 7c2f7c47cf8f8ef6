"""An agent loop through the official ``openai`` client against ``grammarspec serve``.

Start the server in another shell (``grammarspec serve``; it listens on
127.0.0.1:8000), then run::

    python examples/openai_agent.py "What is the weather in Oslo, in celsius?"

The model calls tools (every call's arguments follow the tool's JSON Schema:
the server constrains them), the script runs them in Python and sends the
results back, until the model answers in text.  Each turn re-sends the whole
conversation, as agent frameworks do; the server reuses the KV of the earlier
turns (``usage.prompt_tokens_details.cached_tokens``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import openai

from grammarspec.bench.agent_tasks import SYSTEM, TOOLS, run_tool


def agent(
    client: openai.OpenAI, model: str, question: str, *, max_turns: int = 4, max_tokens: int = 64
) -> list[dict[str, Any]]:
    """Run the loop; returns the conversation (the last message is the model's text answer, if it gave one)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    for turn in range(max_turns):
        last = turn == max_turns - 1
        reply = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            tool_choice="none" if last else "auto",
            temperature=0,
            max_tokens=max_tokens,
        )
        choice = reply.choices[0]
        message = choice.message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True)
        messages.append(message)
        cached = reply.usage.prompt_tokens_details.cached_tokens if reply.usage.prompt_tokens_details else 0
        print(f"turn {turn}: {choice.finish_reason}, {reply.usage.prompt_tokens} prompt tokens ({cached} cached)")
        if choice.finish_reason != "tool_calls":
            print("answer:", choice.message.content)
            break
        for call in choice.message.tool_calls or []:
            result = run_tool(call.function.name, json.loads(call.function.arguments))
            print(f"  {call.function.name}({call.function.arguments}) -> {result}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    return messages


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("question", nargs="?", default="What is the weather in Oslo, in celsius?")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-turns", type=int, default=4)
    args = parser.parse_args(argv)
    client = openai.OpenAI(base_url=args.base_url, api_key="unused")
    return agent(client, args.model, args.question, max_turns=args.max_turns)


if __name__ == "__main__":
    main()
