"""The fuzz report: a markdown summary of checks, and results files read back."""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from .checks import BUG_OUTCOMES, Check
from .enforced import BACKENDS

__all__ = ["summarize", "read_results"]

_KINDS = ("compile", "example", "invalid_example", "generate")


def summarize(checks: Sequence[Check], *, title: str = "Fuzz report", preamble: str = "") -> str:
    """A markdown report: counts per backend, check kind, category and outcome; bugs and findings."""
    lines = [f"# {title}", ""]
    if preamble:
        lines += [preamble.rstrip(), ""]
    records = {c.record for c in checks}
    bugs = [c for c in checks if c.is_bug]
    lines += [
        f"{len(records)} schemas, {len(checks)} checks, **{len(bugs)} bug outcome{'s' if len(bugs) != 1 else ''}**.",
        "",
    ]
    for backend in BACKENDS:
        mine = [c for c in checks if c.backend == backend]
        if not mine:
            continue
        lines += [f"## {backend}", ""]
        for kind in _KINDS:
            of_kind = [c for c in mine if c.kind == kind]
            if not of_kind:
                continue
            outcomes = _ordered_outcomes(of_kind)
            lines += [f"### {kind} ({len(of_kind)} checks)", ""]
            lines += ["| category | " + " | ".join(outcomes) + " |", "| --- |" + " ---: |" * len(outcomes)]
            categories = sorted({c.category for c in of_kind})
            for category in categories + ["**total**"]:
                rows = of_kind if category == "**total**" else [c for c in of_kind if c.category == category]
                counts = Counter(c.outcome for c in rows)
                lines.append(f"| {category} | " + " | ".join(str(counts.get(o, 0)) for o in outcomes) + " |")
            lines.append("")
        timing = [c.seconds for c in mine if c.kind == "compile" and c.outcome == "compiled"]
        if timing:
            timing.sort()
            lines += [
                f"Compile time ({len(timing)} schemas): median {timing[len(timing) // 2]:.2f} s, "
                f"max {timing[-1]:.2f} s.",
                "",
            ]
    lines += ["## Bugs", ""]
    lines += [f"- `{c.record}` {c.backend} {c.kind}: **{c.outcome}** -- {c.detail[:400]}" for c in bugs] or ["None."]
    lines += ["", "## Findings", ""]
    lines += _findings(checks)
    return "\n".join(lines) + "\n"


def _ordered_outcomes(checks: Sequence[Check]) -> list[str]:
    counts = Counter(c.outcome for c in checks)
    return sorted(counts, key=lambda o: (o in BUG_OUTCOMES, -counts[o], o))


def _findings(checks: Sequence[Check]) -> list[str]:
    out: list[str] = []
    warnings: Counter[str] = Counter()
    for c in checks:
        if c.kind == "compile" and c.detail.startswith("warnings: "):
            warnings.update(set(c.detail[len("warnings: ") :].split(" | ")))
    if warnings:
        out += ["xgrammar compile warnings (schemas; what its grammar relaxes):", ""]
        out += [f"- {n} x {w}" for w, n in warnings.most_common()] + [""]
    groups = [
        ("unsupported", "Refused with GrammarError (first line of the message)"),
        ("timeout", "Timeouts"),
        ("rejected_stricter", "Valid examples outlines-core rejects (stricter than the schema)"),
        ("rejected_flagged", "Valid examples xgrammar rejects, as the corpus' meta flags say"),
        ("accepted_unenforced", "Invalid examples accepted: every violation is of an unenforced keyword"),
        ("stop_unenforced", "Finished outputs that violate only unenforced keywords (never claimed valid)"),
    ]
    for outcome, heading in groups:
        found = [c for c in checks if c.outcome == outcome]
        if not found:
            continue
        out += [f"{heading}: {len(found)}", ""]
        out += [f"- `{c.record}` {c.backend}: {c.detail.splitlines()[0][:300] if c.detail else ''}" for c in found[:12]]
        if len(found) > 12:
            out.append(f"- ... and {len(found) - 12} more (see the results file)")
        out.append("")
    return out or ["None."]


def read_results(paths: Sequence[str | os.PathLike[str]]) -> list[Check]:
    """The checks of several results files, a later file's run of a schema replacing an earlier one's.

    A schema that was run again (after a fix, or alone after a timeout) keeps
    only its latest checks for that backend: a (record, backend) pair found in
    a later file drops every check of that pair from the earlier files.
    """
    merged: dict[tuple[str, str], list[Check]] = {}
    for path in paths:
        runs: dict[tuple[str, str], list[Check]] = defaultdict(list)
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.strip():
                check = Check(**json.loads(line))
                runs[(check.record, check.backend)].append(check)
        merged.update(runs)
    return [check for checks in merged.values() for check in checks]
