"""Every flag of the ``potluck`` commands has a help text, and help is plain text."""

from __future__ import annotations

import argparse

import pytest

from potluck.cli import build_parser, commands

_ALL = [[c.name, *([leaf.name] if leaf is not c else [])] for c in commands()
        for leaf in (c.subcommands or (c,))]


def _command_parser(words: list[str]) -> argparse.ArgumentParser:
    parser = build_parser(words)
    for word in words:  # walk down the subcommands
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


@pytest.mark.parametrize("words", _ALL, ids=" ".join)
def test_every_flag_has_help_and_no_rest_markup(words: list[str]) -> None:
    parser = _command_parser(words)
    silent = [a.option_strings[0] for a in parser._actions
              if a.option_strings and not a.help]
    assert not silent, f"potluck {' '.join(words)}: flags without help: {silent}"
    text = parser.format_help()
    assert "``" not in text, f"potluck {' '.join(words)} --help shows reST markup"


@pytest.mark.timeout(30)
def test_run_hands_flags_after_the_script_to_the_script() -> None:
    """A script flag that looks like an abbreviation of a run flag (--metrics of
    --metrics-dir, --status of --status-port) is the script's, not the launcher's."""
    from potluck.cli import build_parser

    argv = ["run", "--nproc-per-node", "2", "train.py", "--metrics", "m.jsonl", "--status",
            "--elastic"]
    args = build_parser(argv).parse_args(argv)
    assert args.script == "train.py"
    assert args.script_args == ["--metrics", "m.jsonl", "--status", "--elastic"]
    assert args.metrics_dir is None and args.status_port is None and not args.elastic
