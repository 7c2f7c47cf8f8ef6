"""Write the repository's schema sample (``data/schemas``) from the full corpus.

    python -m tools.sample_corpus --schemas /path/to/full/schemas --out data/schemas

Keeps every record that one of the fuzz CI slices (:data:`tools.fuzz.CI_SLICES`)
picks from the full corpus, unchanged (examples, prompts, ``meta`` and
``source`` intact: the corpus' lines byte for byte), one ``<category>.jsonl``
per category in the corpus' own order.  Because a slice of a corpus is also the slice of any
sub-corpus holding it, ``tests/grammars/test_fuzz_corpus.py`` runs on the same
schemas whether it reads the sample or the full corpus.  The license files
and the README of ``data/schemas`` are kept by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grammarspec.bench.tasks import TaskFileError, read_schema_records

from .fuzz.corpus import CI_SLICES


def sample(records: list[dict]) -> list[dict]:
    """The records any CI slice picks, in corpus order (pure)."""
    chosen = {r["id"] for part in CI_SLICES.values() for r in part.of(records)}
    return [r for r in records if r["id"] in chosen]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write data/schemas from the full corpus (see the module docstring).")
    parser.add_argument("--schemas", required=True, help="the full corpus folder (<category>.jsonl files)")
    parser.add_argument("--out", default="data/schemas", help="the sample folder (default: data/schemas)")
    args = parser.parse_args(argv)
    try:
        records = read_schema_records(args.schemas)
    except TaskFileError as e:
        raise SystemExit(f"error: {e}") from None
    chosen = {r["id"] for r in sample(records)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for file in sorted(Path(args.schemas).glob("*.jsonl")):  # the lines themselves, byte for byte
        kept = [
            line
            for line in file.read_text(encoding="utf-8").splitlines(keepends=True)
            if line.strip() and json.loads(line).get("id") in chosen
        ]
        if kept:
            (out / file.name).write_text("".join(kept), encoding="utf-8")
            written += len(kept)
            print(f"{file.stem}: {len(kept)} records")
    print(f"wrote {written} of {len(records)} records to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
