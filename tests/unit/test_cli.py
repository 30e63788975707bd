"""The CLI is one static table: every row's handler and flags resolve, and every subcommand says what it does."""

from __future__ import annotations

import argparse

import pytest

from effect_ledger.cli import COMMANDS, _load, build_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_row_names_a_handler_that_imports(name: str) -> None:
    entry = COMMANDS[name]
    assert callable(_load(entry.handler))
    if entry.flags is not None:
        assert callable(_load(entry.flags))


def test_every_subcommand_has_a_help_text_saying_what_it_does() -> None:
    parser = build_parser()
    helps = {action.dest: action.help for action in parser._subparsers._group_actions[0]._choices_actions}  # type: ignore[union-attr]
    assert set(helps) == set(COMMANDS) == set(_subparsers(parser))
    for name, text in helps.items():
        assert text and text != name and len(text.split()) >= 6, f"{name}: {text!r}"


def test_setting_flags_and_own_flags_parse() -> None:
    args = build_parser().parse_args(["token", "--tenant", "t", "--sub", "s", "--port", "9000"])
    assert (args.command, args.tenant, args.sub, args.port, args.ttl) == ("token", "t", "s", 9000, 3600)
    assert build_parser().parse_args(["schema", "--check"]).check is True
