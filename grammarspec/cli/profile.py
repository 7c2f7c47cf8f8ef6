"""``grammarspec profile``: see, delete or measure again the pass-cost profiles this machine keeps.

    grammarspec profile              # = --show
    grammarspec profile --show       # each stored curve: rows -> plain steps, when and how it was measured
    grammarspec profile --reset      # delete them all; the next use measures again
    grammarspec profile --measure --model smollm2-135m --device cpu   # measure one now

The profiles themselves are :mod:`grammarspec.drafting.pass_profile`'s (measured at
first use, checked against the loop's passes by :mod:`grammarspec.drafting.profile_check`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from grammarspec.cli import common as cli_common

__all__ = ["add_profile_command", "format_entry"]


def add_profile_command(commands: Any) -> None:
    profile = commands.add_parser(
        "profile",
        help="show, delete or measure again the pass-cost profiles that size drafts on this machine",
        description="The drafting policy prices a target pass by a profile measured at first use and kept in the "
        "cache directory (pass_cost.json). --show prints each stored curve (rows -> cost in plain steps) and how "
        "it was measured; --reset deletes them (the next use measures again); --measure measures --model's now. "
        "A profile that the passes of a later call disagree with is measured again on its own, with a warning.",
    )
    action = profile.add_mutually_exclusive_group()
    action.add_argument("--show", action="store_true", help="print the stored profiles (the default)")
    action.add_argument("--reset", action="store_true", help="delete every stored profile")
    action.add_argument("--measure", action="store_true", help="measure --model's profile now and store it")
    profile.add_argument(
        "--model",
        default=cli_common.DEFAULT_MODEL,
        metavar="NAME_OR_DIR",
        help=f"with --measure (default: {cli_common.DEFAULT_MODEL})",
    )
    cli_common.add_placement(profile)
    profile.set_defaults(run=_cmd_profile)


def _cmd_profile(args: argparse.Namespace, command: str) -> int:
    from grammarspec.drafting.profile_store import profile_file, reset_profiles, stored_entries

    if args.reset:
        count = reset_profiles()
        print(
            f"deleted {count} stored pass-cost profile{'s' if count != 1 else ''} ({profile_file()}); the next use measures again"
        )
        return 0
    if args.measure:
        label = _measure(args)
        print(format_entry(label, stored_entries().get(label, {})))
        return 0
    entries = stored_entries()
    if not entries:
        print(f"no pass-cost profile stored ({profile_file()}); the first call that drafts measures one")
        return 0
    print(f"{len(entries)} pass-cost profile{'s' if len(entries) != 1 else ''} in {profile_file()}:")
    for label, entry in sorted(entries.items()):
        print()
        print(format_entry(label, entry))
    return 0


def _measure(args: argparse.Namespace) -> str:
    """Load ``--model`` and measure its profile now; the label it is stored under."""
    from grammarspec.drafting.cost_model import measure_cost_model

    cli_common.quiet_transformers()
    model, _ = cli_common.load(args.model, device=args.device, dtype=args.dtype)
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except (AttributeError, OSError):
        load, cores = 0.0, 1
    if load > cores:
        print(
            f"grammarspec profile: warning: the machine is busy (load average {load:.1f} on {cores} cores); passes "
            "timed now may cost more than they will (the loop checks the profile and measures it again)",
            file=sys.stderr,
        )
    try:
        return measure_cost_model(model, why="grammarspec profile --measure")
    except ValueError as e:
        raise cli_common.CliError(str(e)) from None


def format_entry(label: str, entry: dict[str, Any]) -> str:
    """A stored profile as ``--show`` prints it: the label, then how it was measured, the plain step, the curve
    (rows -> plain steps) and the drafted pass's extra terms.  Pure."""
    from grammarspec.drafting.profile_store import PROFILE_FORMAT

    lines = [label]
    if entry.get("format") != PROFILE_FORMAT:
        lines.append(f"  measured another way (format {entry.get('format')}): measured again at its next use")
        return "\n".join(lines)
    how = f"  measured {entry.get('measured_at') or '(time unknown)'}"
    how += f" in {entry.get('measure_seconds', 0):.1f} s, the lowest of {entry.get('rounds', '?')} rounds"
    load = entry.get("load_average")
    if load:
        how += f"; load average {load[0]:.2f} before, {load[1]:.2f} after ({entry.get('cpus') or '?'} CPUs)"
    lines.append(how)
    if entry.get("why"):
        lines.append(f"  measured again: {entry['why']}")
    step, overhead = float(entry["step_ms"]), float(entry["overhead_ms"])
    lines.append(
        f"  a plain step: {step:.2f} ms (its 1-row pass {step - overhead:.2f} ms, the loop's host work {overhead:.2f} ms)"
    )
    table = sorted((int(rows), float(cost)) for rows, cost in entry["table"].items())
    width = max(len(f"{rows}") for rows, _ in table) + 1
    width = max(width, max(len(f"{cost:g}") for _, cost in table) + 1)
    lines.append("  rows        " + "".join(f"{rows:>{width}}" for rows, _ in table))
    lines.append("  plain steps " + "".join(f"{cost:>{width}g}" for _, cost in table))
    lines.append(
        f"  beyond {table[-1][0]} rows: {entry['per_row']:g} a row; a drafted pass adds switch {entry['switch']:g}, "
        f"{entry['per_token']:g} a draft token, {entry['per_draft_row']:g} a further drafting row (plain steps)"
    )
    return "\n".join(lines)
