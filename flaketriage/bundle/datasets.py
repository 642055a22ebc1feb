"""Reducible data inputs: what an item is in each format, how many there are, and a subset's copy.

An item is a CSV record (the header always stays), a non-empty JSON Lines line, an entry along the
first axis of a ``.npy`` array, or a top-level entry of a directory (sorted by name). Kept items
are copied byte for byte, so a subset fails for the same reason the whole did. Files are read as
streams (a ``.npy`` through a memory map), so counting or subsetting a large input holds one
record at a time, not the file.
"""

from __future__ import annotations

import csv
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Literal

from flaketriage.dependencies import require
from flaketriage.errors import DatasetError

DataFormat = Literal["csv", "jsonl", "npy", "dir"]

_SUFFIXES: dict[str, DataFormat] = {
    ".csv": "csv",
    ".tsv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".npy": "npy",
}
_NPY_MAGIC = b"\x93NUMPY"
_SUPPORTED = "CSV/TSV (.csv, .tsv), JSON Lines (.jsonl, .ndjson), NumPy arrays (.npy) or a directory"


def detect_format(path: Path) -> DataFormat:
    """The format of a declared input, from its suffix (or because it is a directory)."""
    path = Path(path)
    if path.is_dir():
        return "dir"
    if not path.exists():
        raise DatasetError(
            f"data input {path} does not exist; expected a file or directory to reduce. "
            "Check the --data path (relative paths are taken from the command's working directory)"
        )
    fmt = _SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise DatasetError(
            f"data input {path} has suffix {path.suffix or '(none)'!r}, which flaketriage cannot reduce; "
            f"supported: {_SUPPORTED}. Rename or convert the file, or put it in a directory and "
            "declare that directory"
        )
    return fmt


def count_items(path: Path, fmt: DataFormat) -> int:
    """How many reducible items ``path`` holds in format ``fmt``."""
    path = Path(path)
    _require(path, fmt)
    if fmt == "csv":
        return max(0, sum(1 for _ in _csv_records(path)) - 1)  # the header is not an item
    if fmt == "jsonl":
        return sum(1 for _ in _jsonl_items(path))
    if fmt == "npy":
        return int(_load_npy(path).shape[0])
    return len(_dir_entries(path))


def empty_note(path: str | Path, fmt: DataFormat, items: int) -> str | None:
    """A warning for a declared input with no items (nothing to minimize), else None."""
    if items:
        return None
    what = {
        "csv": "no records (an empty or header-only CSV)",
        "jsonl": "no non-empty lines",
        "npy": "an array with no entries along its first axis",
        "dir": "an empty directory",
    }[fmt]
    return f"data input {path} holds {what}; it is stored as it is, but there is nothing to minimize"


def write_subset(src: Path, dest: Path, fmt: DataFormat, keep: Sequence[int]) -> None:
    """Write a copy of ``src`` at ``dest`` holding only the items at ``keep``, in their original order.

    Parent directories are created. For a directory, ``dest`` must not exist yet; a file at
    ``dest`` is replaced.
    """
    src, dest = Path(src), Path(dest)
    _require(src, fmt)
    if fmt == "dir" and (dest.exists() or dest.is_symlink()):
        raise DatasetError(
            f"cannot write a subset of {src} to {dest}: it already exists; remove it first or pick a new path"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    if fmt in ("csv", "jsonl"):
        wanted = set(_indices(keep, count_items(src, fmt), src))
        # The CSV header is record 0 and always kept; JSON Lines has no header.
        skip = 1 if fmt == "csv" else 0
        items = _csv_records(src) if fmt == "csv" else _jsonl_items(src)
        with dest.open("w", encoding="utf-8", errors="surrogateescape", newline="") as out:
            for i, text in enumerate(items):
                if i < skip or i - skip in wanted:
                    out.write(text)
    elif fmt == "npy":
        _write_npy_subset(src, dest, keep)
    else:
        entries = _dir_entries(src)
        dest.mkdir()
        for i in _indices(keep, len(entries), src):
            entry = entries[i]
            if entry.is_dir():
                shutil.copytree(entry, dest / entry.name)
            else:
                shutil.copy2(entry, dest / entry.name)


def _require(path: Path, fmt: DataFormat) -> None:
    if fmt == "dir" and not path.is_dir():
        raise DatasetError(f"data input {path} was declared a directory, but no directory is there")
    if fmt != "dir" and not path.is_file():
        raise DatasetError(f"data input {path} was declared {fmt}, but no file is there")


def _indices(keep: Sequence[int], count: int, src: Path) -> list[int]:
    wanted = sorted(set(keep))
    if wanted and (wanted[0] < 0 or wanted[-1] >= count):
        bad = wanted[0] if wanted[0] < 0 else wanted[-1]
        raise DatasetError(
            f"item {bad} is out of range for {src}, which holds {count} items (0..{count - 1})"
        )
    return wanted


# Text is read and written with surrogateescape and no newline translation, so that bytes which
# are not UTF-8 and "\r\n" line ends survive a subset unchanged. Lines end at "\n" only.
def _open_text(path: Path) -> IO[str]:
    try:
        return path.open(encoding="utf-8", errors="surrogateescape", newline="\n")
    except OSError as exc:
        raise _unreadable(path, exc) from exc


def _unreadable(path: Path, exc: OSError) -> DatasetError:
    return DatasetError(
        f"cannot read data input {path} ({exc.strerror or exc}); make it readable by the user "
        "running flaketriage, or leave it out of --data"
    )


def _csv_records(path: Path) -> Iterator[str]:
    """Each record's raw text, the header first, one at a time; blank lines belong to no record."""
    consumed: list[str] = []
    with _open_text(path) as lines:

        def feed() -> Iterator[str]:
            # csv.reader pulls one more line only while a quoted field is open, so the lines it
            # pulled for one record are exactly that record's text.
            for line in lines:
                consumed.append(line)
                yield line

        dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
        reader = csv.reader(feed(), dialect)
        try:
            for row in reader:
                if row:
                    yield "".join(consumed)
                consumed.clear()
        except csv.Error as exc:
            raise DatasetError(
                f"{path} is not readable as CSV near line {reader.line_num} ({exc}); "
                "fix the file or declare it without reduction"
            ) from exc
        except OSError as exc:
            raise _unreadable(path, exc) from exc


def _jsonl_items(path: Path) -> Iterator[str]:
    with _open_text(path) as lines:
        try:
            yield from (line for line in lines if line.strip())
        except OSError as exc:
            raise _unreadable(path, exc) from exc


def _dir_entries(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir(), key=lambda p: p.name)
    except OSError as exc:
        raise _unreadable(path, exc) from exc


def _numpy() -> Any:
    return require("numpy", "data", ".npy data inputs")


def _load_npy(path: Path) -> Any:
    np = _numpy()
    try:
        with path.open("rb") as f:
            magic = f.read(len(_NPY_MAGIC))
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    if magic != _NPY_MAGIC:
        raise DatasetError(
            f"{path} is not a .npy file: it does not start with the NumPy magic bytes "
            f"(found {magic!r}); save it with numpy.save, or declare another format"
        )
    try:
        # Memory-mapped, so counting or slicing a large array does not read all of it.
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except PermissionError as exc:
        raise _unreadable(path, exc) from exc
    except (ValueError, OSError, EOFError) as exc:
        raise DatasetError(
            f"{path} is not a .npy array flaketriage can reduce ({exc}); object arrays need pickle, "
            "which a replay must not load: save a numeric array, or declare the file without reduction"
        ) from exc
    if array.ndim == 0:
        raise DatasetError(f"{path} holds a single value (a 0-d array); there is no first axis to reduce")
    return array


def _write_npy_subset(src: Path, dest: Path, keep: Sequence[int]) -> None:
    np = _numpy()
    array = _load_npy(src)
    index = np.asarray(_indices(keep, int(array.shape[0]), src), dtype=np.intp)
    # Through a file object, because np.save adds ".npy" to a path that lacks it.
    with dest.open("wb") as f:
        np.save(f, np.ascontiguousarray(array[index]))
