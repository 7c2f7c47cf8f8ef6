"""grammarspec.cli.common's option tables: a row adds what the hand-written add_argument call would."""

from __future__ import annotations

import argparse

import pytest

from grammarspec.cli import common as cli_common

ROWS: tuple[cli_common.Value, ...] = (
    ("--count", cli_common.positive_int, 8, "N", "how many (default: 8)"),
    ("--mode", ("fast", "slow"), "fast", None, None),
    ("--name", None, None, "NAME", "a name"),
    ("--size", cli_common.non_negative_float, None, "MB", None),
)


def _by_hand() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--count", type=cli_common.positive_int, default=8, metavar="N", help="how many (default: 8)")
    parser.add_argument("--mode", choices=("fast", "slow"), default="fast")
    parser.add_argument("--name", metavar="NAME", help="a name")
    parser.add_argument("--size", type=cli_common.non_negative_float, metavar="MB")
    return parser


def _from_table() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="p")
    cli_common.add_values(parser, ROWS)
    return parser


def test_an_option_table_reads_and_documents_like_add_argument():
    assert _from_table().format_help() == _by_hand().format_help()
    for argv in ([], ["--count", "3", "--mode", "slow", "--name", "x", "--size", "0.5"]):
        assert _from_table().parse_args(argv) == _by_hand().parse_args(argv)


@pytest.mark.parametrize("argv", [["--count", "0"], ["--mode", "medium"], ["--size", "-1"], ["--count", "x"]])
def test_an_option_table_refuses_like_add_argument(argv, capsys):
    errors = []
    for parser in (_from_table(), _by_hand()):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        errors.append(capsys.readouterr().err)
    assert errors[0] == errors[1] and "error:" in errors[0]
