"""Consoles, progress bars and the options every command shares."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

try:  # typer 0.2x runs on its own copy of click, and raises that copy's errors
    from typer._click import exceptions as usage
except ImportError:  # pragma: no cover - an older typer, on click itself
    from click import exceptions as usage  # type: ignore[no-redef]
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from flaketriage.settings import Settings, load_settings
from flaketriage.text.printable import printable

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


LOCAL_REPORTS = Path(".flaketriage")
"""Where a command run on a store that is not a directory (``s3://``) writes its Markdown issues
and quarantine list, unless their settings say: under the working directory, like a local store."""


def with_local_reports(settings: Settings) -> Settings:
    """`settings` with the issues directory and the quarantine file a store that is not a directory
    cannot hold (``<store>/issues``) under `LOCAL_REPORTS`, and a note on stderr saying so; the
    settings themselves when the store is local or both are set."""
    if settings.local_store() is not None:
        return settings
    update: dict[str, Path] = {}
    if settings.issues_dir is None and settings.github_repo is None:
        update["issues_dir"] = LOCAL_REPORTS / "issues"
    if settings.quarantine_file is None:
        update["quarantine_file"] = LOCAL_REPORTS / "quarantine.json"
    if not update:
        return settings
    what = " and ".join(str(path) for path in update.values())
    err.print(
        labelled(
            "note:",
            "yellow",
            f"the store {settings.store} is not a directory, so reports go to {what} under the working "
            "directory; set FLAKETRIAGE_ISSUES_DIR and FLAKETRIAGE_QUARANTINE_FILE to choose",
        )
    )
    return settings.model_copy(update=update)


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


class Commands(TyperGroup):
    """The ``flaketriage`` group. Its help and every subcommand's show no ``<bool>`` type beside a
    flag (a flag takes no value), and a usage error (an unknown command or option, a missing or bad
    argument) is one ``error:`` line, like every other error, with exit status 2."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        _untype_flags(self)
        try:
            # Not standalone: the errors come here, to be said as every other error is.
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except usage.NoArgsIsHelpError as exc:
            sys.exit(exc.exit_code)  # the help is printed already
        except usage.UsageError as exc:
            err.print(labelled("error:", "red", usage_error_line(exc)))
            sys.exit(exc.exit_code)
        except usage.ClickException as exc:
            err.print(labelled("error:", "red", exc.format_message()))
            sys.exit(exc.exit_code)
        except typer.Abort:
            err.print("aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def usage_error_line(exc: usage.UsageError) -> str:
    """click's message on one line, and where to look: ``No such command 'bogus' (see 'flaketriage
    --help')``, click's "Did you mean 'triage'?" kept."""
    message = " ".join(exc.format_message().split()).rstrip(".")
    where = exc.ctx.command_path if exc.ctx is not None else "flaketriage"
    return f"{message} (see '{where} --help')"


def _no_type(ctx: Any) -> None:
    return None


def _untype_flags(command: Any) -> None:
    """Make `command`'s flags (and its subcommands') show no value type in the rich help."""
    if getattr(command, "_flags_untyped", False):
        return
    get_params: Callable[[Any], list[Any]] = command.get_params

    def params(ctx: Any) -> list[Any]:
        found = get_params(ctx)
        for param in found:
            if getattr(param, "is_flag", False):
                # typer's help asks each parameter for its type's label; a flag has none to show.
                param.display_type_rich = _no_type
        return found

    command.get_params = params
    command._flags_untyped = True
    for sub in getattr(command, "commands", {}).values():
        _untype_flags(sub)
