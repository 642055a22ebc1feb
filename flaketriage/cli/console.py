"""Consoles, progress bars and the options every command shares."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from flaketriage.printable import printable
from flaketriage.settings import Settings, load_settings

# Results go to stdout (plain when piped); progress and diagnostics go to stderr.
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="Store: a directory or a store URL (default: FLAKETRIAGE_STORE, or ./.flaketriage).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def plain(text: object, *, multiline: bool = False, style: str = "") -> Text:
    """Captured text (a message, a path, a command, output) for rich: never read as markup or emoji
    codes, control characters shown as escapes; on one line unless `multiline`."""
    return Text(printable(str(text), keep_newlines=multiline), style=style)


def labelled(label: str, style: str, text: object) -> Text:
    """``label text`` on one line, the label styled and the text `plain` (``error: ...``)."""
    return Text.assemble((label, style), " ", plain(text))


def settings_for(store: str | None) -> Settings:
    """The settings, with ``--store`` over ``FLAKETRIAGE_STORE``; a bad value is a `ConfigError`."""
    return load_settings() if store is None else load_settings(store=store)


@contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Progress]:
    """A progress bar on stderr, shown only on a terminal."""
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not (enabled and err.is_terminal),
    )
    with progress:
        yield progress
