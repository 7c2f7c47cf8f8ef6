"""The main job: a schema-constrained speculative generation on the embedded model.

Runs one extraction twice -- plain constrained decoding and speculative decoding
with the "auto" proposers -- and prints the JSON and the statistics of each.
Greedy decoding, so both outputs are identical token for token.

    make demo          # or: .venv/bin/python examples/demo.py
"""

from __future__ import annotations

import json

import grammarspec

DOCUMENT = """From: orders@bluefinoutdoor.com
Subject: Your order BF-88213 has shipped

Hi Priya,

Good news: order BF-88213 left our Reno warehouse on 2025-03-14 with UPS
(tracking 1Z999AA10123456784). It should arrive by 2025-03-19.

Items in this shipment:
- Trail runner shoes, size 8: 1 @ $129.00
- Merino hiking socks (3-pack): 2 @ $24.50
- Collapsible water bottle: 1 @ $18.00

Shipping: free. Questions? Reply to this email.
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
        },
    },
    "required": ["order_id", "customer_name", "carrier", "tracking_number", "ship_date", "items"],
    "additionalProperties": False,
}

SYSTEM = "You extract data from documents. Copy values exactly as written."


def main() -> None:
    print("loading the embedded SmolLM2-135M-Instruct ...", flush=True)
    model, tokenizer = grammarspec.load_model("smollm2-135m")
    runs = {}
    for label, assistant in (("plain constrained", None), ("speculative (auto)", "auto")):
        result = grammarspec.complete(
            model, tokenizer, DOCUMENT, system=SYSTEM, schema=SCHEMA, assistant=assistant, max_new_tokens=300
        )
        runs[label] = result
        print(f"\n=== {label}")
        print(json.dumps(result.value, indent=2) if result.value is not None else result.text)
        print(f"valid: {result.valid}  |  {result.stats.summary()}")
    plain, spec = runs["plain constrained"], runs["speculative (auto)"]
    same = plain.tokens == spec.tokens
    speedup = spec.stats.tokens_per_second / max(plain.stats.tokens_per_second, 1e-9)
    print(
        f"\nidentical output: {same}; speedup {speedup:.2f}x; "
        f"{spec.stats.accepted_per_forward:.2f} tokens per target forward pass "
        f"(plain: {plain.stats.accepted_per_forward:.2f})"
    )


if __name__ == "__main__":
    main()
