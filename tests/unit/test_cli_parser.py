"""The command line's shape: --version, and help for every command and option."""

from __future__ import annotations

import argparse
import io
import sys

import pytest

from ingest import __version__
from ingest.cli.parser import build_parser


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"ingest {__version__}"


def _commands(parser: argparse.ArgumentParser, path: str = "ingest") -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _commands(sub, f"{path} {name}")
    return out


def test_every_command_and_option_has_help() -> None:
    missing = []
    for path, parser in _commands(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{path} {a.dest}" for a in action._choices_actions if not a.help]
            elif action.option_strings and not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings)}")
    assert not missing, missing


def test_every_command_but_worker_takes_json() -> None:
    leaves = [
        (path, parser)
        for path, parser in _commands(build_parser())
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    ]
    assert [path for path, parser in leaves if "--json" not in parser._option_string_actions] == ["ingest worker"]


def test_the_exit_code_table_is_the_exit_code_enum_and_lists_every_exception() -> None:
    import inspect
    import re
    from pathlib import Path

    import ingest.errors
    import ingest_common.errors
    import metastore.errors
    from ingest_common.errors import ExitCode, IngestError

    cli_doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    rows = re.findall(r"^\| (\d+) \|.*\|([^|]*)\|$", cli_doc, re.MULTILINE)
    table = {int(code): raised.strip() for code, raised in rows}
    assert set(table) == {int(code) for code in ExitCode}
    for module in (ingest_common.errors, ingest.errors, metastore.errors):
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if not issubclass(cls, Exception) or cls.__module__ != module.__name__:
                continue
            # One root: the CLI's single `except IngestError` turns every one into one line.
            assert issubclass(cls, IngestError), f"{name} is not an IngestError"
            assert isinstance(cls.exit_code, ExitCode)
            if "exit_code" in vars(cls) or cls is IngestError:
                assert f"`{name}`" in table[cls.exit_code], f"{name} (exit {cls.exit_code}) is not in docs/cli.md's row"


def test_every_command_has_examples_that_parse() -> None:
    import shlex

    from ingest.cli.parser import EXAMPLES

    leaves = [
        path.removeprefix("ingest ")
        for path, parser in _commands(build_parser())
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    ]
    assert sorted(leaves) == sorted(EXAMPLES)
    for command, lines in EXAMPLES.items():
        for line in lines:
            words = shlex.split(line.split("#", 1)[0].split("|", 1)[0])
            while "=" in words[0] and words[0].split("=", 1)[0].isupper():  # VAR=value before the command
                words.pop(0)
            assert words[0] == "ingest" and " ".join(words[1:]).startswith(command), line
            build_parser().parse_args(words[1:])  # SystemExit (argparse's error) fails the test


def test_a_command_logs_to_stderr_and_its_json_alone_goes_to_stdout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc, reset and the others log events while they run: with --json, stdout must stay one
    document whatever they log."""
    import json

    import structlog

    import ingest.cli as cli

    def command(_args: argparse.Namespace) -> int:
        structlog.get_logger("ingest.ops.gc").warning("gc_abandoned_splits", source="s", splits=1)
        print(json.dumps({"schema_version": 1}))
        return 0

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=command)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setenv("INGEST_LOG_FORMAT", "json")
    try:
        assert cli.main([]) == 0
        out, err = capsys.readouterr()
        # Events go to whatever stderr is when they are written: a stream replaced (or closed
        # by a test's capture) after the command configured logging is never written to.
        later = io.StringIO()
        monkeypatch.setattr(sys, "stderr", later)
        structlog.get_logger("ingest.ops.gc").warning("gc_deleted", source="s")
    finally:
        structlog.reset_defaults()
    assert json.loads(out) == {"schema_version": 1}
    assert json.loads(err.strip().splitlines()[-1])["event"] == "gc_abandoned_splits"
    assert json.loads(later.getvalue())["event"] == "gc_deleted"
