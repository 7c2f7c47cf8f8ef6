"""The main job: a schema-constrained speculative generation on the embedded model.

Extracts a shipping notice into JSON with speculative decoding (the "auto"
proposers), prints the complete, schema-valid answer, checks its values against what the
notice says ("schema-valid" means it follows the schema, not that it is
right), and its statistics, then
decodes the same prompt with plain constrained decoding and reports the
speedup measured on that answer (greedy: both outputs are identical token for
token).  ``maxItems`` matches the notice's three items, so the model ends the
document by itself instead of repeating items until the token limit.

    make demo          # or: .venv/bin/python examples/demo.py [--help]
"""

from __future__ import annotations

import argparse
import json
import sys

import grammarspec
from grammarspec.drafting.cost_model import batch_cost_model
from proposers.cost import PassCost

DOCUMENT = """From: orders@bluefinoutdoor.com
Subject: Your order BF-88213 has shipped

Hi Priya,

Good news: order BF-88213 has shipped.
Carrier: UPS
Tracking number: 1Z999AA10123456784
Ship date: 2025-03-14

Items in this shipment:
- Trail runner shoes, quantity 1, price 129.00
- Merino hiking socks, quantity 2, price 24.50
- Collapsible water bottle, quantity 1, price 18.00

Bluefin Outdoor Supply

Extract the shipment as JSON."""

SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "customer_name": {"type": "string"},
        "carrier": {"type": "string", "enum": ["UPS", "FedEx", "USPS", "DHL"]},
        "tracking_number": {"type": "string"},
        "ship_date": {"type": "string", "format": "date"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "description": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1},
                    "unit_price": {"type": "number", "minimum": 0},
                },
                "required": ["description", "quantity", "unit_price"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 3,
        },
    },
    "required": ["order_id", "customer_name", "carrier", "tracking_number", "ship_date", "items"],
    "additionalProperties": False,
}

#: What the notice says: the demo checks the answer against it ("schema-valid" alone says nothing of this).
EXPECTED = {
    "order_id": "BF-88213",
    "customer_name": "Priya",
    "carrier": "UPS",
    "tracking_number": "1Z999AA10123456784",
    "ship_date": "2025-03-14",
    "items": [
        {"description": "Trail runner shoes", "quantity": 1, "unit_price": 129.0},
        {"description": "Merino hiking socks", "quantity": 2, "unit_price": 24.5},
        {"description": "Collapsible water bottle", "quantity": 1, "unit_price": 18.0},
    ],
}


def wrong_fields(value: object) -> list[str]:
    """The top-level fields of ``value`` that differ from what the document says ([] when all are right)."""
    if not isinstance(value, dict):
        return sorted(EXPECTED)
    return [name for name, want in EXPECTED.items() if value.get(name) != want]


SYSTEM = "You extract data from documents. Copy values exactly as written."


def describe_cost(cost: PassCost) -> str:
    """A pass of ``rows`` rows in plain steps, in one line."""
    return f"{cost.cost(8):.2f} plain steps for 8 rows, {cost.cost(32):.2f} for 32"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Schema-constrained speculative decoding on the embedded SmolLM2-135M: one extraction, its "
        "statistics, and the speedup over plain constrained decoding on the same answer."
    )
    parser.add_argument("--assistant", default="auto", help="proposer preset (default: auto)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="token limit (default: 256)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain constrained run (no speedup)")
    args = parser.parse_args(argv)

    print("loading the embedded SmolLM2-135M-Instruct ...", flush=True)
    model, tokenizer = grammarspec.load_model("smollm2-135m")
    # The drafting policy sizes drafts by what a pass of n rows costs on this machine: profiled once per
    # model, device, dtype and thread count, and kept on disk (grammarspec/drafting/profile_store.py).  Done here,
    # before the timed runs, so the first run's statistics do not include it.
    print(
        "pass cost on this machine (profiled once, then read from ~/.cache/grammarspec): "
        f"{describe_cost(batch_cost_model(model))}",
        flush=True,
    )
    kwargs = {"system": SYSTEM, "schema": SCHEMA, "max_new_tokens": args.max_new_tokens}
    spec = grammarspec.complete(model, tokenizer, DOCUMENT, assistant=args.assistant, **kwargs)
    print(f"\n=== speculative (assistant={args.assistant!r})")
    print(json.dumps(spec.value, indent=2) if spec.value is not None else spec.text)
    print(
        f"complete and schema-valid: {spec.valid} (finish: {spec.finish_reason}"
        f"{'; ' + '; '.join(spec.errors) if spec.errors else ''})"
    )
    wrong = wrong_fields(spec.value)
    print(
        "'schema-valid' means the JSON follows the schema, not that its values are right; checked against the "
        "document: " + (f"wrong fields: {', '.join(wrong)}" if wrong else f"all {len(EXPECTED)} fields are right")
    )
    print(spec.stats.summary())
    if not spec.valid:
        print("the answer is not a complete, valid document: raise --max-new-tokens", file=sys.stderr)
        return 1
    if args.no_baseline:
        return 0
    plain = grammarspec.complete(model, tokenizer, DOCUMENT, assistant=None, **kwargs)
    print("\n=== plain constrained decoding, same prompt")
    print(plain.stats.summary())
    same = plain.tokens == spec.tokens
    print(
        f"\nidentical output: {same}; on this answer speculative decoding took {spec.stats.target_forwards} target "
        f"forward passes instead of {plain.stats.target_forwards} ({spec.stats.accepted_per_forward:.2f} vs "
        f"{plain.stats.accepted_per_forward:.2f} tokens per pass) and {spec.stats.total_seconds:.1f}s instead of "
        f"{plain.stats.total_seconds:.1f}s: {plain.stats.total_seconds / max(spec.stats.total_seconds, 1e-9):.2f}x faster "
        "(wall clock; depends on the machine's load)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
