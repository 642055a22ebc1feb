"""The data a pytest test declares for its bundle, stored and reduced as ``capture --data`` inputs.

Three ways to declare it, all read when a test fails (a passing suite pays nothing):

- the marker ``@pytest.mark.flaketriage_data("data/prices.csv", ...)``: paths relative to the
  rootdir;
- the ini option ``flaketriage_data`` (one path or glob a line, relative to the rootdir): data of
  every test;
- the fixture ``flaketriage_data``, for data the test builds: ``path = flaketriage_data.add(p)``
  declares the file (or directory) ``p`` the test wrote, anywhere (``tmp_path``...), and returns the
  path the test must read it from. That is ``p`` itself, except inside a replay, where it is the
  captured copy (minimized, when the minimizer tries a subset), which a replay restores at a stable
  path under the invocation directory: ``.flaketriage-data/<test>/<name>``. A test that reads ``p``
  instead would read what it rebuilt, and no reduction could show which rows matter.

A declared path that leads out of the rootdir (``..``, an absolute path, a symbolic link to
elsewhere), that is missing, or that ``capture --data`` would refuse (a format it cannot reduce, a
broken CSV) is left out with one warning line in the session summary; the bundle is still written.
Standard library only at import: the plugin imports this at start-up.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flaketriage.process.replay_env import in_replay

if TYPE_CHECKING:
    from flaketriage.bundle.manifest import DataInput
    from flaketriage.store import Store

MARKER = "flaketriage_data"
INI = "flaketriage_data"
DATA_DIR = ".flaketriage-data"
"""Where a replay restores the data a test declared with the fixture (under the invocation dir)."""

MARKER_HELP = (
    f"{MARKER}(*paths): data files or directories (relative to the rootdir) this test reads; "
    "flaketriage stores them in the bundle of a failure and minimizes them"
)


@dataclass(frozen=True)
class Declared:
    """One declared input, checked to be where a bundle may take it from."""

    path: Path
    """The file or directory, resolved."""
    rel: str
    """Where a replay restores it: relative to the invocation directory (the rerun's cwd)."""
    shown: str
    """What declared it, as the warning names it: ``marker path 'data/x.csv'``..."""
    workspace: Path
    """Where links inside a declared directory may point."""


class BuiltData:
    """What the ``flaketriage_data`` fixture gives a test: `add` declares the data it built."""

    def __init__(self, nodeid: str, invocation_dir: Path, environ: Mapping[str, str] = os.environ) -> None:
        self.nodeid = nodeid
        self.invocation_dir = invocation_dir
        self._replay = in_replay(environ)
        self.added: list[tuple[Path, str]] = []
        """(the path the test wrote, where a replay restores it), in the order declared."""

    def add(self, path: str | os.PathLike[str]) -> Path:
        """Declare a file or directory this test wrote (a relative path: from the current
        directory); returns the path to read it from: `path`, or inside a replay its captured copy."""
        written = Path(os.path.abspath(path))
        name = written.name or "data"
        same = sum(1 for w, _ in self.added if (w.name or "data") == name)
        # The n-th input of one name is restored as "n-name": the suffix (its format) stays.
        rel = f"{DATA_DIR}/{data_key(self.nodeid)}/{f'{same + 1}-' if same else ''}{name}"
        self.added.append((written, rel))
        restored = self.invocation_dir / rel
        if self._replay and (restored.exists() or restored.is_symlink()):
            return restored
        return written


def data_key(nodeid: str) -> str:
    """A directory name for one test: readable, bounded, and distinct for distinct node ids."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("._")[:80]
    return f"{readable}-{hashlib.sha256(nodeid.encode()).hexdigest()[:10]}"


def declared_data(
    *,
    marker_paths: Iterable[object],
    ini_patterns: Iterable[str],
    added: Sequence[tuple[Path, str]],
    rootdir: Path,
    invocation_dir: Path,
) -> tuple[list[Declared], list[str]]:
    """The inputs a failing test declared, checked, and a warning for each one left out."""
    notes: list[str] = []
    results = [_static(raw, f"marker path {raw!r}", rootdir, invocation_dir) for raw in marker_paths]
    for pattern in ini_patterns:
        results += [
            _static(raw, shown, rootdir, invocation_dir) for raw, shown in _expand(pattern, rootdir, notes)
        ]
    results += [_added(written, rel) for written, rel in added]
    notes += [r for r in results if isinstance(r, str)]
    return [r for r in results if isinstance(r, Declared)], notes


def _expand(pattern: str, rootdir: Path, notes: list[str]) -> list[tuple[str, str]]:
    """The paths an ini line names: itself, or what its glob matches under the rootdir."""
    shown = f"ini {INI} entry {pattern!r}"
    if not glob.has_magic(pattern) or os.path.isabs(pattern):
        return [(pattern, shown)]
    matches = sorted(glob.glob(pattern, root_dir=rootdir, recursive=True))
    if not matches:
        notes.append(f"{shown} matches no file under the rootdir {rootdir}; no data taken from it")
    return [(m, f"{shown} (matching {m!r})") for m in matches]


def _static(raw: object, shown: str, rootdir: Path, invocation_dir: Path) -> Declared | str:
    """A marker or ini path, relative to the rootdir, or why it is left out."""
    if not isinstance(raw, str | os.PathLike) or not str(raw):
        return f"{shown}: expected a path relative to the rootdir, got {raw!r}; left out of the bundle"
    text = os.fspath(raw)
    if os.path.isabs(text):
        return f"{shown} is absolute; give it relative to the rootdir {rootdir}; left out of the bundle"
    root = Path(os.path.realpath(rootdir))
    lexical = Path(os.path.normpath(root / text))
    if not _inside(lexical, root):
        return f"{shown} leads out of the rootdir {rootdir}; only data inside it is captured"
    real = Path(os.path.realpath(lexical))
    if not _inside(real, root):
        return (
            f"{shown} is a symbolic link to {real}, outside the rootdir {rootdir}: never followed, "
            "left out of the bundle"
        )
    if not real.exists():
        return f"{shown}: no such file or directory under the rootdir {rootdir}; left out of the bundle"
    cwd = Path(os.path.realpath(invocation_dir))
    if not _inside(real, cwd):
        return (
            f"{shown} is outside the directory pytest runs in ({invocation_dir}), and a replay restores "
            "data relative to it; run pytest from a directory that holds the data; left out of the bundle"
        )
    if real == cwd:
        return (
            f"{shown} is the whole directory pytest runs in; declare the data in it; left out of the bundle"
        )
    return Declared(path=real, rel=real.relative_to(cwd).as_posix(), shown=shown, workspace=cwd)


def _added(written: Path, rel: str) -> Declared | str:
    shown = f"flaketriage_data.add({str(written)!r})"
    if written.is_symlink():
        return f"{shown} is a symbolic link: never followed; declare the file itself; left out of the bundle"
    if not written.exists():
        return f"{shown}: no such file or directory when the test failed; left out of the bundle"
    return Declared(
        path=written, rel=rel, shown=shown, workspace=written if written.is_dir() else written.parent
    )


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def store_declared(
    store: Store, declared: Sequence[Declared], invocation_dir: Path
) -> tuple[tuple[DataInput, ...], list[str]]:
    """Store each input as ``capture --data`` does (the same checks, streamed into the store);
    one that check refuses is left out with a warning."""
    from flaketriage.bundle.datasets import empty_note
    from flaketriage.capture.record import check_data, store_checked
    from flaketriage.errors import DatasetError

    stored: dict[str, DataInput] = {}
    notes: list[str] = []
    for item in declared:
        if item.rel in stored:
            continue  # declared twice (a marker and an ini glob): one input
        try:
            checked = check_data(item.path, invocation_dir, rel=item.rel)
            stored[item.rel] = store_checked(store, checked, item.workspace)
        except DatasetError as exc:
            notes.append(f"{item.shown}: {exc}; left out of the bundle")
            continue
        note = empty_note(item.shown, checked.format, checked.items)
        if note is not None:
            notes.append(note)
    return tuple(stored.values()), notes
