"""Benchmark: peak memory of ``capture --data`` on large inputs (goal: under 2× the file + 150 MB).

Run from the repository root: ``python bench/capture_memory.py [--runs 3] [--mb 155]``.
Generates a CSV, a ``.npy`` array and a JSON Lines file of about ``--mb`` MB each in a temporary
project, then runs what a user runs, ``python -m flaketriage capture --data FILE -- python -c
'raise SystemExit(1)'`` (a failing command, so the data is stored in a bundle), with a fresh store
each time. The peak resident set of that whole process tree is read from ``wait4`` (the kernel's
``ru_maxrss`` for the child and everything it waited for). Linux counts a child's peak from the
parent's size at the fork, so the files are written by a separate process and this one stays small:
its own size, printed as the floor, is the least any row can show.

Beside it, interleaved run by run, two baselines: ``python -m flaketriage --version`` (the
interpreter and the CLI's imports, reading nothing: the floor any capture pays) and ``cp FILE``
(reading and writing the same bytes through the page cache, which a streaming capture should
resemble). The A/A row is the spread between repeated captures of the same file: a difference
smaller than that is noise. Exits 1 when any capture's peak passes its goal.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check

MB = 1_000_000
SLACK = 150 * MB
FAIL = [sys.executable, "-c", "raise SystemExit(1)"]


def write_csv(path: Path, size: int) -> None:
    row = b'12345,0.123456789,"a quoted, text field",another column,987654321\n'
    block = row * 1000
    with path.open("wb") as f:
        f.write(b"id,x,text,other,n\n")
        for _ in range(max(1, size // len(block))):
            f.write(block)


def write_jsonl(path: Path, size: int) -> None:
    line = (
        json.dumps({"id": 12345, "x": 0.123456789, "text": "some text", "tags": ["a", "b"]}) + "\n"
    ).encode()
    block = line * 1000
    with path.open("wb") as f:
        for _ in range(max(1, size // len(block))):
            f.write(block)


def write_npy(path: Path, size: int) -> None:
    import numpy as np

    rows = max(1, size // (64 * 8))
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(rows, 64))
    for start in range(0, rows, 100_000):  # filled in slices, so writing it costs little memory
        stop = min(rows, start + 100_000)
        array[start:stop] = np.arange(start, stop, dtype=np.float64)[:, None]
    array.flush()
    del array


def generate(fmt: str, path: Path, size: int) -> None:
    """Write the file in a child process, so that this one (whose size every child starts from)
    never holds the data, numpy, or a memory map of it."""
    subprocess.run([sys.executable, __file__, "--write", fmt, str(path), str(size)], check=True)


WRITERS: dict[str, Callable[[Path, int], None]] = {"csv": write_csv, "npy": write_npy, "jsonl": write_jsonl}


def peak_rss(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, int]:
    """Exit status and peak RSS in bytes of `argv` and everything it waited for."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
    proc.stderr.close()
    if b"Traceback" in err:
        raise SystemExit(f"{argv} printed a traceback:\n{err.decode(errors='replace')}")
    return proc.returncode, usage.ru_maxrss * 1024  # KiB on Linux


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3, help="runs of each variant per file")
    parser.add_argument("--mb", type=int, default=155, help="size of each generated file (MB)")
    parser.add_argument("--write", nargs=3, metavar=("FORMAT", "PATH", "BYTES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:  # the generator's own process (see `generate`)
        fmt, path, size = args.write
        WRITERS[fmt](Path(path), int(size))
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    size = args.mb * MB
    rows = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="flaketriage-bench-") as tmp:
        project = Path(tmp) / "project"
        project.mkdir()
        env["TMPDIR"] = tmp
        for fmt in WRITERS:
            name = f"big.{fmt}"
            data = project / name
            generate(fmt, data, size)
            file_size = data.stat().st_size
            goal = 2 * file_size + SLACK
            variants: dict[str, list[str]] = {
                "capture": [sys.executable, "-m", "flaketriage", "capture", "--data", name, "--", *FAIL],
                "flaketriage --version": [sys.executable, "-m", "flaketriage", "--version"],
                "cp FILE": ["cp", name, str(Path(tmp) / "copy")],
            }
            peaks: dict[str, list[int]] = {v: [] for v in variants}
            for i in range(args.runs + 1):  # the first round warms the page cache and is dropped
                order = list(variants.items())
                if i % 2:
                    order.reverse()  # neither variant always runs right after the other
                for label, argv in order:
                    shutil.rmtree(project / ".flaketriage", ignore_errors=True)
                    code, peak = peak_rss(argv, project, env)
                    expected = 1 if label == "capture" else 0
                    if code != expected:
                        raise SystemExit(f"{label} on {name} exited {code}, expected {expected}")
                    if i:
                        peaks[label].append(peak)
            (Path(tmp) / "copy").unlink(missing_ok=True)
            data.unlink()  # keep the disk (or tmpfs) footprint to one file at a time
            capture = peaks["capture"]
            # A/A: each capture against the next one of the same file.
            aa = [b / a for a, b in itertools.pairwise(capture)] or [1.0]
            passed = max(capture) < goal
            ok = ok and passed
            rows.append((name, file_size, goal, capture, peaks, aa, passed))

    print(f"\npeak RSS of the whole command, {args.runs} interleaved runs each (median, min–max), MB\n")
    header = (
        f"{'file':<10} {'size':>6} {'goal':>6} | {'capture':>16} {'A/A':>11} | "
        f"{'--version':>9} {'cp':>5} | ok"
    )
    print(header)
    print("-" * len(header))
    for name, file_size, goal, capture, peaks, aa, passed in rows:
        spread = f"{min(capture) / MB:.0f}–{max(capture) / MB:.0f}"
        print(
            f"{name:<10} {file_size / MB:>6.0f} {goal / MB:>6.0f} | "
            f"{statistics.median(capture) / MB:>5.0f} ({spread:>8}) {min(aa):>5.2f}–{max(aa):<5.2f} | "
            f"{statistics.median(peaks['flaketriage --version']) / MB:>9.0f} "
            f"{statistics.median(peaks['cp FILE']) / MB:>5.0f} | {'PASS' if passed else 'FAIL'}"
        )
    print(
        "\ngoal: 2 × file size + 150 MB. Baselines: `flaketriage --version` reads nothing (interpreter "
        "and imports);\n`cp FILE` streams the same bytes. Capture minus --version is what the data costs."
    )
    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"floor (this process's own peak, which every child's figure starts from): {floor / MB:.0f} MB")
    print()
    for name, file_size, goal, capture, _, _, passed in rows:
        check(
            f"capture --data {name} ({file_size / MB:.0f} MB): max peak RSS MB",
            f"{max(capture) / MB:.0f}",
            "<",
            f"{goal / MB:.0f}",
            passed,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
