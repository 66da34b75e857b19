"""`maxit ...`: the command line. Each command is a parser function and a thin call into the
library (`maxit/run_commands.py`: run, rollout, ui, runs, report, sql; `maxit/stage_commands.py`:
advantages, view, train, model, sandbox); heavy modules are imported only by the command that
needs them."""

from __future__ import annotations

import argparse
import sys

from maxit.baseline_commands import add_baselines_parser
from maxit.common import settings_of
from maxit.run_commands import (
    add_report_parser,
    add_rollout_parser,
    add_run_parser,
    add_runs_parser,
    add_sql_parser,
    add_ui_parser,
    small_splits,
)
from maxit.stage_commands import (
    add_advantages_parser,
    add_model_parser,
    add_sandbox_parser,
    add_train_parser,
    add_view_parser,
)
from pipeline.errors import MaxitError, RunInterrupted, SchemaError, one_line

__all__ = ["main", "build_parser", "COMMANDS", "settings_of", "small_splits"]

COMMANDS = (
    add_advantages_parser,
    add_run_parser,
    add_ui_parser,
    add_runs_parser,
    add_report_parser,
    add_baselines_parser,
    add_rollout_parser,
    add_view_parser,
    add_train_parser,
    add_model_parser,
    add_sql_parser,
    add_sandbox_parser,
)
"""The commands, in the order `maxit --help` lists them: each adds its parser to the subparsers."""


class OneLineErrors(argparse.ArgumentParser):
    """Bad flags are reported in one line naming the flag, with a pointer to `--help`, not after
    argparse's whole usage (forty lines for `maxit run`, which push the error off a small
    terminal). Subcommands' parsers are of this class too (`add_subparsers` uses the parent's)."""

    def error(self, message: str):
        what = "commands" if self._subparsers is not None else "flags"
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the {what})\n")


def parser_given(parser: argparse.ArgumentParser, argv: list[str], unknown: list[str]) -> argparse.ArgumentParser:
    """The (sub)command parser `argv` had reached when its first unknown argument came: the
    top-level one for `maxit --x run`, `maxit sandbox run`'s for `maxit sandbox run p.py --x`."""
    current = parser
    for token in argv:
        if token in unknown:
            break
        commands = next((a for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        if commands is not None and token in commands.choices:
            current = commands.choices[token]
    return current


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(prog="maxit", description="Multi-Agent eXpert ITeration: train teams of LLM agents by expert iteration.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_parser in COMMANDS:
        add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # an unknown flag is reported by the parser of the (sub)command it was given to (pointing at
    # `maxit run --help`), not by the top-level one, where argparse's parse_args would report it
    raw = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(raw)
    if unknown:
        parser_given(parser, raw, unknown).error(f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = raw[raw.index(args.command) + 1 :] if args.command in raw else raw
    try:
        return int(args.func(args) or 0)
    except (MaxitError, SchemaError, FileNotFoundError) as err:
        print(f"maxit {args.command}: error: {one_line(err)}", file=sys.stderr)
        return 130 if isinstance(err, RunInterrupted) else 2


if __name__ == "__main__":
    raise SystemExit(main())
