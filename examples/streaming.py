"""Stream schema-constrained output token by token, on the embedded model.

grammarspec hands every run of committed tokens to a Hugging Face streamer
(``streamer=``), exactly when it is committed: one token per step without
speculation, several per step when drafts are accepted.  Two ways to watch:

* a small ``BaseStreamer`` that prints each committed token as it arrives
  (compact JSON has few spaces, and Hugging Face's ``TextStreamer`` releases
  text at spaces, so it would print in bursts);
* ``TextIteratorStreamer``: generation runs in a thread, the caller iterates
  over text chunks -- the pattern a web server uses.

    .venv/bin/python examples/streaming.py
    .venv/bin/python examples/streaming.py --quick      # fewer tokens (CI smoke test)
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
from transformers import TextIteratorStreamer
from transformers.generation.streamers import BaseStreamer

import grammarspec

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "genre": {"type": "string", "enum": ["fantasy", "science fiction", "mystery", "romance"]},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "characters": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 30},
                    "role": {"type": "string", "maxLength": 30},
                },
                "required": ["name", "role"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 3,
        },
    },
    "required": ["title", "genre", "year", "characters"],
    "additionalProperties": False,
}

PROMPT = "Invent a short novel: give its title, genre, year and up to three main characters."


class TokenPrinter(BaseStreamer):
    """Prints each committed token's text as soon as it arrives; keeps the pieces.

    ``put`` receives the prompt first (skipped), then each run of committed
    token ids.  Text is decoded from all ids so far, so a character split over
    several byte-level tokens appears once it is complete.
    """

    def __init__(self, tokenizer: Any, write: Callable[[str], None] = lambda text: print(text, end="", flush=True)):
        self.tokenizer = tokenizer
        self.write = write
        self.ids: list[int] = []
        self.pieces: list[str] = []  # one entry per put() of committed tokens
        self.prompt_seen = False
        self.printed = 0

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # the prompt comes first, as in Hugging Face generate
            self.prompt_seen = True
            return
        self.ids += value.reshape(-1).tolist()
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for the rest
            return
        piece = text[self.printed :]
        self.printed = len(text)
        self.pieces.append(piece)
        self.write(piece)

    def end(self) -> None:
        self.write("\n")


def stream_tokens(model: Any, tokenizer: Any, *, max_new_tokens: int, assistant: Any = "auto", write=None):
    """Generate with a :class:`TokenPrinter`; returns ``(printer, completion text, stats)``."""
    ids = torch.tensor([grammarspec.build_prompt(tokenizer, PROMPT, schema=SCHEMA)])
    printer = TokenPrinter(tokenizer, **({"write": write} if write is not None else {}))
    out = grammarspec.generate(
        model,
        ids,
        tokenizer=tokenizer,
        schema=SCHEMA,
        assistant=assistant,
        max_new_tokens=max_new_tokens,
        streamer=printer,
        return_dict_in_generate=True,
    )
    stats = out.stats[0]
    text = tokenizer.decode(out.sequences[0, ids.shape[1] : ids.shape[1] + stats.new_tokens], skip_special_tokens=True)
    return printer, text, stats


def stream_chunks(model: Any, tokenizer: Any, *, max_new_tokens: int, assistant: Any = "auto") -> tuple[list[str], Any]:
    """Generate in a thread and iterate over a ``TextIteratorStreamer``; returns (chunks, stats)."""
    ids = torch.tensor([grammarspec.build_prompt(tokenizer, PROMPT, schema=SCHEMA)])
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["out"] = grammarspec.generate(
                model,
                ids,
                tokenizer=tokenizer,
                schema=SCHEMA,
                assistant=assistant,
                max_new_tokens=max_new_tokens,
                streamer=streamer,
                return_dict_in_generate=True,
            )
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = e
            streamer.end()

    thread = threading.Thread(target=work)
    thread.start()
    chunks = [chunk for chunk in streamer if chunk]  # blocks until each chunk is ready
    thread.join()
    if "error" in result:
        raise result["error"]
    return chunks, result["out"].stats[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens")
    parser.add_argument("--assistant", default="auto", help="proposer preset ('none' for plain decoding)")
    args = parser.parse_args(argv)
    quick = args.quick or os.environ.get("GRAMMARSPEC_EXAMPLES_QUICK", "") not in ("", "0")
    max_new_tokens = 48 if quick else 200
    assistant = None if args.assistant == "none" else args.assistant
    model, tokenizer = grammarspec.load_model("smollm2-135m")

    print("== token by token (each committed run of tokens printed as it arrives)")
    printer, _, stats = stream_tokens(model, tokenizer, max_new_tokens=max_new_tokens, assistant=assistant)
    print(f"{stats.new_tokens} tokens arrived in {len(printer.pieces)} pieces; {stats.summary()}")

    print("\n== TextIteratorStreamer (generation in a thread, text chunks in this one)")
    chunks, stats = stream_chunks(model, tokenizer, max_new_tokens=max_new_tokens, assistant=assistant)
    for chunk in chunks:
        print(f"[{chunk}]", end="", flush=True)
    print(f"\n{len(chunks)} chunks; finish: {stats.finish_reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
