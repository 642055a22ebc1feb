"""Benchmark: reading JUnit XML (goals: a 50,000-test file read in at most 1 s; a 50 MB attribute
read in at most five times the file's size of memory).

Run from the repository root: ``python bench/junit.py [--tests 50000] [--rounds 9]``.

**Speed.** The pytest-style file of ``bench/results.py`` (1% failing, 0.5% passed on a rerun), read
in process, interleaved in a fresh order each round after a warm-up round:

- ``parse``, the floor: defusedxml's parser over the same bytes with a target that does nothing
  (what parsing alone costs, before a test is read);
- ``read_junit`` and ``read_junit (A/A)``: `flaketriage.results.junit.read_junit`, twice, the
  second for the noise.

The figure is the median wall time of ``read_junit``; beside it, its ratio to ``parse`` per round,
and the CPU time of each (on a shared machine the truer cost of the code: wall time there also
counts the other processes' turns).
What ``flaketriage results upload`` adds around it (the process, the upload's key) is in
``bench/results.py``'s ``parse`` row.

**Memory.** One test whose name is a 50 MB attribute (and whose failure message is 10 MB), read
under tracemalloc: the peak of Python's allocations (expat's buffers included), once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check
from paired import Spread, interleave
from results import write_junit

from flaketriage.results.junit import read_junit


class _Nothing:
    """A parser target that keeps nothing: what parsing costs by itself."""

    def start(self, tag: str, attrib: dict[str, str]) -> None: ...
    def end(self, tag: str) -> None: ...
    def data(self, text: str) -> None: ...
    def close(self) -> None: ...


def parse_only(data: bytes) -> None:
    from defusedxml.ElementTree import DefusedXMLParser

    parser = DefusedXMLParser(target=_Nothing(), forbid_dtd=True, forbid_entities=True, forbid_external=True)
    parser.feed(data)
    parser.close()


def timed(run: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "junit.xml"
        write_junit(path, args.tests)
        data = path.read_bytes()
    tests = read_junit(data)
    assert len(tests) == args.tests, len(tests)
    measured = interleave(
        {
            "parse": lambda: timed(lambda: parse_only(data)),
            "read_junit": lambda: timed(lambda: read_junit(data)),
            "read_junit (A/A)": lambda: timed(lambda: read_junit(data)),
        },
        args.rounds,
    )
    times = {name: [wall for wall, _ in values] for name, values in measured.items()}
    cpu = {name: [seconds for _, seconds in values] for name, values in measured.items()}
    print(f"{args.tests:,} tests, {len(data) / 1e6:.1f} MB of JUnit XML, {args.rounds} rounds:")
    for name, values in times.items():
        print(
            f"  {name:17s} median {statistics.median(values) * 1000:6.0f} ms "
            f"(range {min(values) * 1000:.0f}–{max(values) * 1000:.0f}), "
            f"CPU {statistics.median(cpu[name]) * 1000:.0f} ms"
        )
    print(f"  read_junit / parse   {Spread.ratios(times['read_junit'], times['parse']).ratio_text()}")
    print(
        f"  A/A                  {Spread.ratios(times['read_junit (A/A)'], times['read_junit']).ratio_text()}"
    )
    load = os.getloadavg()[0]
    print(f"  load average {load:.1f} on {os.cpu_count()} CPUs while it ran")
    median = statistics.median(times["read_junit"])
    ok = check(f"read_junit of {args.tests:,} tests", f"{median:.2f} s", "<=", "1 s", median <= 1.0)

    name, message = "n" * 50_000_000, "m" * 10_000_000
    huge = f'<testsuite><testcase name="{name}"><failure message="{message}"/></testcase></testsuite>'
    del name, message
    data = huge.encode()
    del huge
    tracemalloc.start()
    start = time.perf_counter()
    read_junit(data)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"a 50 MB attribute: {len(data) / 1e6:.0f} MB file, read in {seconds:.1f} s (under tracemalloc)")
    ok &= check(
        "memory of a 50 MB attribute", f"{peak / len(data):.1f}x the file", "<=", "5x", peak <= 5 * len(data)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
