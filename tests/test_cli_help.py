"""`hpolab <command> --help` explains every option and argument it lists: none is shown with an empty
meaning (the CLI reference page is generated from the same help texts)."""

from __future__ import annotations

import argparse

import pytest

from conftest import run_cli


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, its parser) for the top level and every command and subcommand."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _shown(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options and arguments `--help` lists (the suppressed store options of a command are the top
    level's, listed there)."""
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
            and a.help is not argparse.SUPPRESS and a.default is not argparse.SUPPRESS]


def _words(text: str) -> str:
    return " ".join(text.split())


def test_every_option_of_every_command_has_a_meaning_in_its_help():
    from hpolab.cli import build_parser

    commands = list(_commands(build_parser()))
    assert len(commands) > 20, [" ".join(p) for p, _ in commands]
    missing = [f"hpolab {' '.join(path)} {'/'.join(a.option_strings) or a.metavar or a.dest}"
               for path, parser in commands for a in _shown(parser) if not (a.help or "").strip()]
    assert not missing, "options and arguments without a help text:\n" + "\n".join(missing)


@pytest.mark.slow
def test_help_output_shows_each_meaning():
    """The real `--help` of each command (through the console script) prints every option's meaning."""
    from hpolab.cli import build_parser

    for path, parser in _commands(build_parser()):
        out = run_cli(*path, "--help").stdout
        shown = _words(out)
        for a in _shown(parser):
            meaning = _words(parser._get_formatter()._expand_help(a)) if a.help else ""
            assert meaning and meaning in shown, f"hpolab {' '.join(path)} --help: no meaning shown for {a.option_strings or a.dest}:\n{out}"
