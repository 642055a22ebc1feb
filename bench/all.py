"""Run every benchmark and print one table of their goals: ``python bench/all.py``.

Each benchmark runs as its own process (``--quick`` where it has one, unless ``--full``), its output
shown as it comes and read for its goal lines (``goal: <figure> <op> <target>: ok|MISSED``, see
``bench/goals.py``). The table at the end has a row per goal: bench, figure, goal, ok or MISSED; a
benchmark that exits non-zero without saying which goal it missed gets a MISSED row of its own.
Benchmarks whose tools or services are missing here are listed as skipped, with the reason. Exits
1 when any goal is missed.

    python bench/all.py [--full] [--only minimize verdict] [--skip ingest] [--timeout 1800]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import parse

HERE = Path(__file__).resolve().parent
HELPERS = {"all", "goals", "paired", "service_stack", "seed", "dashboard_app", "dashboard_data"}
"""Modules in bench/ that are not benchmarks."""
POSTGRES = os.environ.get("FLAKETRIAGE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass(frozen=True)
class Bench:
    """A benchmark script and what it needs to run here."""

    name: str
    quick: tuple[str, ...] = ("--quick",)
    tools: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    services: bool = False
    """Redis and PostgreSQL (``FLAKETRIAGE_TEST_POSTGRES``)."""


BENCHES = (
    Bench("minimize"),
    Bench("verdict", modules=("numpy",)),
    Bench("polluters"),
    Bench("replay"),
    Bench("pytest_plugin"),
    Bench("guards", modules=("torch",)),
    Bench("capture_memory", quick=("--runs", "1"), modules=("numpy",)),
    Bench("store", tools=("cp", "sha256sum", "tar")),
    Bench("workers", tools=("redis-server",), modules=("psycopg", "httpx"), services=True),
    Bench("ingest", tools=("redis-server", "wrk"), modules=("psycopg",), services=True),
    Bench("quarantine_fetch", tools=("redis-server",), modules=("psycopg", "httpx"), services=True),
    Bench("results", tools=("redis-server",), modules=("psycopg", "httpx"), services=True),
    Bench("dashboard", tools=("redis-server",), modules=("psycopg", "httpx"), services=True),
    Bench("reliability", modules=("psycopg", "schemathesis", "hypothesis"), services=True),
    Bench("overload", tools=("redis-server",), modules=("psycopg", "httpx"), services=True),
    Bench("chaos", tools=("redis-server", "runuser"), modules=("psycopg", "httpx", "moto")),
)


@dataclass
class Outcome:
    bench: str
    command: list[str]
    skipped: str = ""
    status: int | None = None
    seconds: float = 0.0
    goals: list[tuple[str, str, bool]] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)


def discovered() -> list[Bench]:
    """The registered benchmarks, then any other script in bench/ (run as it is, with --quick when
    its source mentions it), so that none is left out silently."""
    known = {b.name for b in BENCHES}
    extra = []
    for path in sorted(HERE.glob("*.py")):
        if path.stem in known or path.stem in HELPERS:
            continue
        quick = ("--quick",) if '"--quick"' in path.read_text(errors="replace") else ()
        extra.append(Bench(path.stem, quick=quick))
    return [b for b in BENCHES if (HERE / f"{b.name}.py").exists()] + extra


def postgres_answers() -> str:
    """Why PostgreSQL cannot be used here ("" when it answers)."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        with psycopg.connect(POSTGRES, connect_timeout=3):
            return ""
    except psycopg.Error as exc:
        return f"PostgreSQL does not answer at {POSTGRES} ({str(exc).strip().splitlines()[0]})"


def missing(bench: Bench, postgres: str) -> str:
    """Why `bench` cannot run here ("" when it can)."""
    tools = [t for t in bench.tools if shutil.which(t) is None]
    if tools:
        return f"needs {', '.join(tools)} (not installed)"
    modules = [m for m in bench.modules if importlib.util.find_spec(m) is None]
    if modules:
        return f"needs the Python module {', '.join(modules)}"
    if bench.services and postgres:
        return f"needs Redis and PostgreSQL: {postgres}"
    return ""


def run(bench: Bench, full: bool, timeout: float, echo: bool) -> Outcome:
    command = [sys.executable, str(HERE / f"{bench.name}.py"), *(() if full else bench.quick)]
    outcome = Outcome(bench.name, command)
    print(f"\n===== {' '.join(['bench/' + bench.name + '.py', *command[2:]])}", flush=True)
    start = time.perf_counter()
    lines: list[str] = []
    with subprocess.Popen(
        command, cwd=HERE.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        timer = threading.Timer(timeout, proc.kill)  # a bench that hangs silently is ended too
        timer.start()
        try:
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if echo:
                    print(line, end="", flush=True)
        finally:
            timer.cancel()
        outcome.status = proc.wait()
        if outcome.status < 0:
            lines.append(f"(ended by signal {-outcome.status}; the limit is {timeout:.0f} s)")
    outcome.seconds = time.perf_counter() - start
    outcome.tail = lines[-5:]
    for line in lines:
        goal = parse(line)
        if goal is not None:
            outcome.goals.append((goal.figure, goal.target, goal.ok))
    return outcome


def table(outcomes: list[Outcome]) -> bool:
    rows: list[tuple[str, str, str, str]] = []
    passed = True
    for o in outcomes:
        if o.skipped:
            rows.append((o.bench, f"skipped: {o.skipped}", "", "skipped"))
            continue
        for figure, target, ok in o.goals:
            rows.append((o.bench, figure, target, "ok" if ok else "MISSED"))
            passed &= ok
        if o.status != 0 and all(ok for _, _, ok in o.goals):
            last = next((line for line in reversed(o.tail) if line.strip()), "")
            rows.append(
                (o.bench, f"exited {o.status} without a missed goal line: {last.strip()}", "", "MISSED")
            )
            passed = False
        elif o.status == 0 and not o.goals:
            rows.append((o.bench, "exited 0 but printed no goal line", "", "MISSED"))
            passed = False
    width = min(110, max(len(r[1]) for r in rows))
    bench_w = max(len(r[0]) for r in rows)
    target_w = max(len(r[2]) for r in rows)
    print("\n" + "=" * 30 + " all benchmarks " + "=" * 30)
    print(f"{'bench':<{bench_w}} | {'figure':<{width}} | {'goal':<{target_w}} | result")
    print("-" * (bench_w + width + target_w + 17))
    for bench, figure, target, result in rows:
        figure = figure if len(figure) <= width else figure[: width - 1] + "…"
        print(f"{bench:<{bench_w}} | {figure:<{width}} | {target:<{target_w}} | {result}")
    timing = ", ".join(f"{o.bench} {o.seconds:.0f} s" for o in outcomes if not o.skipped)
    print(f"\ntime per bench: {timing}")
    print(f"all goals met: {'yes' if passed else 'NO'}")
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--full", action="store_true", help="run each bench in full, not with --quick")
    parser.add_argument("--only", nargs="+", default=None, metavar="BENCH", help="run only these")
    parser.add_argument("--skip", nargs="+", default=[], metavar="BENCH", help="leave these out (listed)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per bench before it is killed")
    parser.add_argument(
        "--no-echo", action="store_true", help="print only the table, not each bench's output"
    )
    args = parser.parse_args()
    benches = discovered()
    names = {b.name for b in benches}
    unknown = [n for n in [*(args.only or []), *args.skip] if n not in names]
    if unknown:
        parser.error(f"no such bench: {', '.join(unknown)} (there are: {', '.join(sorted(names))})")
    postgres = postgres_answers() if any(b.services for b in benches) else ""
    outcomes = []
    for bench in benches:
        if args.only is not None and bench.name not in args.only:
            continue  # not asked for: not part of this run's table
        why = "left out with --skip" if bench.name in args.skip else missing(bench, postgres)
        if why:
            outcomes.append(Outcome(bench.name, [], skipped=why))
            continue
        outcomes.append(run(bench, args.full, args.timeout, not args.no_echo))
    return 0 if table(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
