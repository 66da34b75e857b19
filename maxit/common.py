"""What the `maxit` commands share: printing within the console's width, the settings of a command
that takes only some of them, the notes on strategies an algorithm's source does not sample, and a
store read from a folder or a URL."""

from __future__ import annotations

import textwrap
from pathlib import Path

from pipeline.run import LINE_WIDTH

__all__ = ["say", "print_frame", "settings_of", "print_source_notes", "local_store"]


def say(text: str, width: int = LINE_WIDTH) -> None:
    """Print `text` in lines of at most `width` characters (continuations indented), flushed."""
    for paragraph in text.splitlines() or [""]:
        print("\n".join(textwrap.wrap(paragraph, width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False)) or paragraph, flush=True)


def print_frame(df, title: str | None = None, width: int = LINE_WIDTH) -> None:
    """A Polars frame as a table of at most `width` characters (columns that do not fit are
    elided by Polars)."""
    import polars as pl

    if title:
        print()
        say(title, width)
    with pl.Config(tbl_rows=200, tbl_cols=40, tbl_width_chars=width, float_precision=3, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        print(df)


def settings_of(args, names, **values):
    """The `Settings` of the flags `names` of a command that takes only some settings (those left
    alone, and every other setting, at their defaults: the algorithm's and the loss's presets)."""
    from pipeline.run.settings import Settings

    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    return Settings(**given, **{k: v for k, v in values.items() if v is not None})


def print_source_notes(command: str, settings, strategies, wrap: bool = False) -> None:
    """A note for each of `strategies` (those of the run, or of the table a command reads) that
    the algorithm's source does not sample (`pipeline.run.settings.unsourced_strategies`), one
    line each, or with `wrap` in lines of at most `LINE_WIDTH` characters (`maxit run`'s)."""
    from pipeline.config.presets import unsourced_strategies

    for note in unsourced_strategies(settings.algorithm, strategies, settings.reward_mix()[0]):
        say(f"{command}: note: {note}") if wrap else print(f"{command}: note: {note}", flush=True)


def local_store(store: str, flag: str = "--store") -> Path:
    """The folder a command reads a store from: the store, or for a URL (`s3://bucket/run`) its
    local working copy, first made to hold the URL's tables (checkpoints are not downloaded)."""
    from pipeline.store import Tables

    tables = Tables(store)
    tables.check(flag)
    tables.pull(reconcile=True)
    return tables.root
