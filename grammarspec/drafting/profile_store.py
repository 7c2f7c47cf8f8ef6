"""Where pass-cost profiles are kept: one per model, device, dtype, thread count and torch version, on disk.

:func:`stored_measurement` keeps each fitted profile
(:mod:`grammarspec.drafting.pass_profile`) in ``pass_cost.json`` in the cache
directory (:func:`grammarspec.model.loading.cache_dir`), keyed by the model,
the device (with its name), the dtype, the thread count and the torch
version, with what it was fitted from (the plain step's and each pass's
seconds) and how it was measured (when, in how many rounds, the load average
before and after): a machine profiles a model once, and later processes size
drafts as the first did, until the passes the loop times disagree with the
curve (:mod:`grammarspec.drafting.profile_check`: the entry is then measured
again).  ``grammarspec profile --show`` prints the stored curves, ``--reset``
deletes them; an entry of an older :data:`PROFILE_FORMAT` (its terms measured
another way) is profiled again.  A file that cannot be read or written is
ignored (the profile is then the process's only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from grammarspec.drafting.pass_profile import Measured, profile_or_prior
from grammarspec.drafting.profile_fit import measured_points
from grammarspec.policy.cost import Clock
from proposers.cost import PassCost

__all__ = [
    "PROFILE_FORMAT",
    "forget_profile",
    "profile_file",
    "reset_profiles",
    "stored_entries",
    "stored_measurement",
    "stored_profile",
]

#: How the stored terms are measured; an entry of another format is profiled again.
PROFILE_FORMAT = 5


def profile_file() -> Path:
    """Where fitted profiles are kept: ``pass_cost.json`` in the cache directory (``$GRAMMARSPEC_CACHE``, else
    ``~/.cache/grammarspec``: :func:`grammarspec.model.loading.cache_dir`, beside the dequantized embedded models)."""
    from grammarspec.model.loading import cache_dir

    return cache_dir() / "pass_cost.json"


def stored_profile(model: Any, key: str, *, clock: Clock | None = None) -> PassCost:
    """The curve of :func:`stored_measurement`."""
    return stored_measurement(model, key, clock=clock).cost


def stored_measurement(model: Any, key: str, *, clock: Clock | None = None, why: str = "") -> Measured:
    """The profile stored under ``key`` on this machine, else one measured now
    (:func:`~grammarspec.drafting.pass_profile.measure_profile`) and stored there.

    ``key`` names the model, device, dtype, thread count and torch version
    (:func:`grammarspec.drafting.cost_model.batch_cost_model` builds it).  ``why``: measure
    again whatever is stored, for that reason (kept in the entry).  A file
    that cannot be read or written is ignored (the profile is then this
    process's only).  Where the model cannot be profiled, the prior
    :class:`PassCost` with a warning, and nothing stored (the next process
    tries again).  Changes the file when it measures.
    """
    path = profile_file()
    if not why:
        found = _from_entry(_read_profiles(path).get(key))
        if found is not None:
            return found
    measured = profile_or_prior(model, clock=clock, why=why)
    if measured.step_seconds is None:  # the model refused: nothing stored (the next process tries again)
        return measured
    stored = _read_profiles(path)  # read again: another process may have stored a key since
    stored[key] = _to_entry(measured)
    _write_profiles(path, stored)
    return measured


def stored_entries() -> dict[str, dict[str, Any]]:
    """Every stored profile, by key, as kept in :func:`profile_file` (``{}`` when there is none).  Pure."""
    return {key: entry for key, entry in _read_profiles(profile_file()).items() if isinstance(entry, dict)}


def forget_profile(key: str) -> bool:
    """Delete the profile stored under ``key`` (the next use measures it again); whether there was one.  Changes
    the file."""
    path = profile_file()
    stored = _read_profiles(path)
    if stored.pop(key, None) is None:
        return False
    _write_profiles(path, stored)
    return True


def reset_profiles() -> int:
    """Delete every stored profile (the file); how many there were.  Changes the file."""
    path = profile_file()
    count = len(stored_entries())
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    return count


def _from_entry(entry: Any) -> Measured | None:
    """The :class:`Measured` of a stored entry, or ``None`` when it is missing, of another format or not whole."""
    try:
        if entry["format"] != PROFILE_FORMAT:
            raise ValueError("measured another way")
        cost = PassCost(
            float(entry["base"]),
            float(entry["per_row"]),
            int(entry["min_rows"]),
            switch=float(entry["switch"]),
            per_token=float(entry["per_token"]),
            per_draft_row=float(entry["per_draft_row"]),
            table={int(rows): float(cost) for rows, cost in entry["table"].items()},
        )
        load = entry.get("load_average")
        return Measured(
            cost,
            float(entry["step_ms"]) / 1000,
            float(entry["overhead_ms"]) / 1000,
            {int(rows): float(ms) / 1000 for rows, ms in entry["pass_ms"].items()},
            str(entry.get("measured_at", "")),
            int(entry.get("rounds", 0)),
            (float(load[0]), float(load[1])) if load else None,
            float(entry.get("measure_seconds", 0.0)),
            str(entry.get("why", "")),
        )
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):  # none stored, or not a whole curve
        return None


def _to_entry(measured: Measured) -> dict[str, Any]:
    cost = measured.cost
    assert measured.step_seconds is not None, "only a measured profile is stored"
    return {
        "format": PROFILE_FORMAT,
        "base": cost.base,
        "per_row": cost.per_row,
        "min_rows": cost.min_rows,
        "switch": cost.switch,
        "per_token": cost.per_token,
        "per_draft_row": cost.per_draft_row,
        "table": {str(rows): value for rows, value in measured_points(cost).items()},
        "step_ms": round(1000 * measured.step_seconds, 4),
        "overhead_ms": round(1000 * measured.overhead_seconds, 4),
        "pass_ms": {str(rows): round(1000 * s, 4) for rows, s in measured.pass_seconds.items()},
        "measured_at": measured.measured_at,
        "rounds": measured.rounds,
        "load_average": list(measured.load_average) if measured.load_average else None,
        "cpus": os.cpu_count(),
        "measure_seconds": round(measured.measure_seconds, 2),
        "why": measured.why,
    }


def _write_profiles(path: Path, stored: dict[str, Any]) -> None:
    """Replace the file with ``stored`` at once (a reader sees the old file or the new one); ignored if it cannot
    be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(stored, indent=1, sort_keys=True))
        os.replace(temporary, path)
    except OSError:
        pass


def _read_profiles(path: Path) -> dict[str, Any]:
    """The stored profiles, or {} when the file is missing, unreadable or not a JSON object."""
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}
