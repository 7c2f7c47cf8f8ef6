"""What every subcommand of the command line shares: the default model, argument checks, model loading, reports.

A leaf the subcommand modules (:mod:`grammarspec.cli.main`, :mod:`grammarspec.cli.serve`) import from.
Subcommands load models through the module (``cli_common.load(...)``), so that one patched
:func:`load` serves every subcommand.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MODEL",
    "CliError",
    "number",
    "positive_int",
    "non_negative_float",
    "quiet_transformers",
    "split_names",
    "check_known",
    "out_folder",
    "write_report",
    "load",
    "add_placement",
    "Value",
    "add_values",
    "load_for_timing",
    "warn_if_busy",
    "chosen_conversations",
]

DEFAULT_MODEL = "smollm2-135m"


class CliError(Exception):
    """Bad arguments or inputs: printed as ``error: ...`` with exit status 2."""


def number(parse: Callable[[str], Any], minimum: int | None = None, why: str = "") -> Callable[[str], Any]:
    """An argparse ``type=``: *parse* (``int`` or ``float``) the text, refusing values under *minimum*.

    Both refusals say what was expected (*why* explains the bound), and argparse prints them after the option name.
    """
    kind = "a whole number" if parse is int else "a number"

    def read(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}{why}, got {text}")
        return value

    return read


def quiet_transformers() -> None:
    """No weight-loading bars or generation-flag warnings on the command line."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


positive_int = number(int, 1)
non_negative_float = number(float, 0)


def split_names(text: str | None) -> list[str]:
    """A comma-separated option's names, blanks dropped."""
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def check_known(flag: str, names: list[str], known: Sequence[str] | dict[str, Any], note: str = "") -> list[str]:
    """*names* when each is one of *known*; else a CliError that names the unknown ones and the choices."""
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CliError(f"{flag}: unknown {', '.join(unknown)}; {note}choose from {', '.join(known)}")
    return names


def out_folder(text: str) -> Path:
    """``--out``: a folder, or a path that does not exist yet (a file there is a CliError)."""
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out} exists and is not a folder")
    return out


def write_report(out: Path, stem: str, markdown: str, data: Any) -> None:
    """Write ``stem.md`` and ``stem.json`` into *out*, print the markdown and say where they went."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(markdown, encoding="utf-8")
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    print(markdown)
    print(f"wrote {out / (stem + '.md')} and {out / (stem + '.json')}", file=sys.stderr)


def load(name: str, what: str = "--model", *, device: str | None = None, dtype: str | None = None) -> tuple[Any, Any]:
    from grammarspec.model.loading import ModelNotFoundError, checked_device, load_model

    try:
        checked_device(device)  # before the model loads, and only its errors are the flag's
    except ValueError as e:
        raise CliError(f"--device: {e}") from None
    try:
        return load_model(name, device=device, dtype=dtype)
    except ModelNotFoundError as e:
        raise CliError(f"{what}: {e}") from None


def add_placement(parser: Any) -> None:
    """``--device`` and ``--dtype``: where the model runs and in what precision."""
    from grammarspec.model.loading import DTYPES

    parser.add_argument(
        "--device",
        default="cpu",
        metavar="DEVICE",
        help="torch device the model runs on: cpu, cuda, cuda:1, ... (default: cpu)",
    )
    parser.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="the model's weights and activations (default: float32)"
    )


#: An option that takes one value: ``(flag, kind, default, metavar, help)``.  ``kind`` is the argparse ``type=``
#: (a callable) or its ``choices=`` (a tuple); ``None`` in any place leaves argparse's own default.
Value = tuple[str, Callable[[str], Any] | tuple[str, ...] | None, Any, str | None, str | None]


def add_values(group: Any, rows: Sequence[Value]) -> None:
    """Add each row of an option table to ``group`` (a parser or an argument group), in order."""
    for flag, kind, default, metavar, text in rows:
        choices = kind if isinstance(kind, tuple) else None
        parse = None if isinstance(kind, tuple) else kind
        group.add_argument(flag, type=parse, choices=choices, default=default, metavar=metavar, help=text)


def load_for_timing(name: str, *, device: str | None = None, dtype: str | None = None) -> tuple[Any, Any]:
    """``--model`` loaded quietly, then a warning if the machine is busy (the timings would be off)."""
    quiet_transformers()
    loaded = load(name, device=device, dtype=dtype)
    warn_if_busy()
    return loaded


def warn_if_busy() -> None:
    """Timings are only as good as the machine is quiet: say so when it is not."""
    import os

    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except (AttributeError, OSError):
        return
    if load > cores:  # this process accounts for about 1
        print(
            f"grammarspec bench: warning: the machine is busy (load average {load:.1f} on {cores} cores); "
            "other processes make the timings noisy",
            file=sys.stderr,
        )


def chosen_conversations(names: str | None, conversations: dict[str, Any]) -> dict[str, Any]:
    """``--conversations a,b`` -> those scripts (all when not given); an unknown name is a CliError."""
    if not names:
        return dict(conversations)
    return {n: conversations[n] for n in check_known("--conversations", split_names(names), conversations)}
