"""Extract a document into a pydantic model, on the embedded model.

``schema=`` takes the pydantic class itself; the grammar makes the output a
JSON document of that model (keys in declaration order, compact JSON), and
``Model.model_validate`` turns it into Python objects.  The schema-aware
drafters copy values from the document, so extraction is where speculation
pays most.

    .venv/bin/python examples/extract_pydantic.py
    .venv/bin/python examples/extract_pydantic.py --quick    # a shorter document (CI smoke test)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Literal

from pydantic import BaseModel, Field

import grammarspec


class Contact(BaseModel):
    name: str = Field(max_length=60)
    company: str = Field(max_length=60)
    job_title: str = Field(max_length=60)
    email: str = Field(max_length=80)
    phone: str | None = Field(default=None, max_length=30)
    city: str = Field(max_length=40)
    preferred_contact: Literal["email", "phone"]


DOCUMENT = """Hi team,

great meeting you at the Lisbon fintech summit! As promised, my details:

Marta Oliveira
Head of Partnerships, Quintal Payments
marta.oliveira@quintalpay.pt | +351 912 345 678
Based in Porto. Email is the best way to reach me.

Best,
Marta"""

SHORT_DOCUMENT = (
    "Call me: Jonas Weber, CTO at Lumen Labs, Berlin. jonas@lumenlabs.de, phone +49 30 1234567 (phone preferred)."
)

SYSTEM = "You extract contact details into JSON. Copy values exactly as written."


def extract(model: Any, tokenizer: Any, document: str, *, assistant: Any = "auto", max_new_tokens: int = 400):
    """``(Contact or None, Completion)``: the validated object when the output is complete and valid.

    Every string field has a ``max_length``, so the document always fits in
    400 tokens: the output is complete (it usually needs about 100).

    The schema is not quoted in the prompt (``describe=False``): the grammar
    already enforces it, and a 135M model follows a short instruction better.
    """
    result = grammarspec.complete(
        model,
        tokenizer,
        "Extract the contact details from this message:\n\n" + document,
        system=SYSTEM,
        schema=Contact,
        describe=False,
        assistant=assistant,
        max_new_tokens=max_new_tokens,
    )
    contact = Contact.model_validate(result.value) if result.valid else None
    return contact, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter document")
    parser.add_argument("--assistant", default="auto", help="proposer preset ('none' for plain decoding)")
    args = parser.parse_args(argv)
    quick = args.quick or os.environ.get("GRAMMARSPEC_EXAMPLES_QUICK", "") not in ("", "0")
    model, tokenizer = grammarspec.load_model("smollm2-135m")
    document = SHORT_DOCUMENT if quick else DOCUMENT
    contact, result = extract(
        model, tokenizer, document, assistant=None if args.assistant == "none" else args.assistant
    )
    print(result.text)
    print(result.stats.summary())
    if contact is None:
        print(f"no valid contact ({result.finish_reason}): {result.errors}")
        return 1
    print(repr(contact))
    return 0


if __name__ == "__main__":
    sys.exit(main())
