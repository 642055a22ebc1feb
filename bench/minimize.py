"""Benchmark: replays the minimizer needs to find k culprits among n items, against the information
bound log2 C(n, k) and against plain ddmin; then the whole noisy path as triage runs it.

Run from the repository root: ``python bench/minimize.py`` (``--quick`` for fewer culprit sets and
trials). Every predicate call is a replay in real use, so calls are the cost that matters.

Noise-free part: for each n in 1,000 / 10,000 / 100,000 and k in 1 / 2 / 4, the culprits are drawn
at random (plus the edge cases: first, last, adjacent, spread to both ends) and the failure needs
all k of them; a second set of rows needs any one of k. The goal is on the most calls any set
needed, not the mean: at n = 10,000 at most 15 / 34 / 66 calls for k = 1 / 2 / 4 (bounds 13.3 /
25.6 / 48.6), and at the other sizes the same multiple of their bound. Every result is checked
with the predicate directly (uncounted): exactly the culprit set (or one of the alternatives) and
1-minimal; and every subset asked is recorded: the whole input is never asked, no subset twice.

Noisy part: a failure that reproduces with probability ``rate`` (and a candidate only when it holds
every culprit) goes through what ``flaketriage triage --minimize`` runs: the `SequentialTest` on
Bernoulli replays, then the real `BundleMinimizer` (`NoisyOracle` from the verdict's counts,
trusting a failure that reproduced every time until a check catches a miss, the `SubsetReducer`
searching with cheap questions and confirming its answer carefully) through a simulated replayer.
Goal: the minimal set is exactly the culprits in at least 99% of trials, with the Clopper–Pearson
interval's low end printed beside it.

End-to-end part: what a user pays, counted by the program itself. For k = 1 / 2 / 4 culprits among
a 10,000-row CSV, ``flaketriage capture --data rows.csv -- python prog.py`` and then
``flaketriage triage BUNDLE --minimize --json`` (the real CLI, the real sandbox); ``prog.py`` sends
one datagram to a Unix socket outside its sandbox each time it starts and fails when every
culprit row is present. Runs counted during the triage minus the verdict's replays is the
minimization's cost, printed beside the reducer alone on the same culprits (the noise-free
predicate) and the goal, 15 / 34 / 66 at most; the minimal bundle's rows are read back and must
be exactly the culprits. Then the same at rate 0.7 (the program fails with probability 0.7 when
the culprits are present, seeded from os.urandom), where the minimal rows must be exact in every
trial the data allow to be 99% (the interval's high end at least 99%). The counter's socket lives
under ``--scratch`` (default the checkout's ``.flaketriage/``), which must lie outside /tmp:
replays see a private /tmp of their own. Exits 1 on any miss.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import hashlib
import io
import json
import math
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

# Run as a script from a checkout, without installing the package first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check

from flaketriage.bundle.io import load_manifest
from flaketriage.errors import MinimizeError
from flaketriage.store import LocalStore, Store
from flaketriage.workers.minimize.minimizer import BundleMinimizer, MinimizeResult
from flaketriage.workers.minimize.noisy_oracle import DEFAULT_ERROR, SEARCH_ERROR, TRUST_CHECK_RUNS
from flaketriage.workers.minimize.reducer import SubsetReducer, ddmin
from flaketriage.workers.replay import Variant
from flaketriage.workers.triage import should_minimize
from flaketriage.workers.verdict import Outcome, SequentialTest, VerdictPolicy, clopper_pearson

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1_000, 10_000, 100_000)
REFERENCE_N = 10_000
LIMITS = {1: 15, 2: 34, 4: 66}
"""Most calls allowed at n = 10,000; other sizes get the same multiple of their own bound."""
NOISY_RATES = (1.0, 0.7, 0.5, 0.3)
NOISY_EXACT_GOAL = 0.99
DATA = "rows.csv"


def bound(n: int, k: int) -> float:
    """log2 C(n, k): the bits needed to name k culprits among n items."""
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


def limit(n: int, k: int) -> float:
    if n == REFERENCE_N:
        return float(LIMITS[k])
    return LIMITS[k] * bound(n, k) / bound(REFERENCE_N, k)


def _contains(sorted_items: Sequence[int], value: int) -> bool:
    # The reducer hands a subset in the items' order, and the items here are 0..n-1: sorted.
    i = bisect.bisect_left(sorted_items, value)
    return i < len(sorted_items) and sorted_items[i] == value


class Failure:
    """The predicate over subsets of items 0..n-1: fails when all culprits are present (or, with
    ``needs_all=False``, any one). Calling it records the subset; `holds` asks without recording."""

    def __init__(self, n: int, culprits: Sequence[int], *, needs_all: bool = True) -> None:
        self.n = n
        self.culprits = sorted(culprits)
        self.needs_all = needs_all
        self.asked: list[bytes] = []
        self.whole_asked = 0

    def holds(self, subset: Sequence[int]) -> bool:
        present = (_contains(subset, c) for c in self.culprits)
        return all(present) if self.needs_all else any(present)

    def __call__(self, subset: Sequence[int]) -> bool:
        self.asked.append(hashlib.blake2b(array("q", subset).tobytes(), digest_size=16).digest())
        self.whole_asked += len(subset) == self.n
        return self.holds(subset)

    def problems(self, found: list[int]) -> list[str]:
        """What is wrong with `found` and with the questions asked (empty when nothing is)."""
        wrong = []
        exact = found == self.culprits if self.needs_all else len(found) == 1 and found[0] in self.culprits
        if not exact:
            wrong.append(
                f"found {found}, culprits {self.culprits} (needs {'all' if self.needs_all else 'any'})"
            )
        if not self.holds(found) or any(self.holds(found[:i] + found[i + 1 :]) for i in range(len(found))):
            wrong.append(f"{found} is not 1-minimal")
        if self.whole_asked:
            wrong.append("the whole input was asked")
        if len(set(self.asked)) != len(self.asked):
            wrong.append(f"{len(self.asked) - len(set(self.asked))} subsets asked twice")
        return wrong


def culprit_sets(rng: random.Random, n: int, k: int, count: int) -> list[list[int]]:
    """The edge cases (first, last, adjacent in the middle, spread to both ends), then random sets."""
    middle = n // 2
    edges = [
        list(range(k)),
        list(range(n - k, n)),
        list(range(middle, middle + k)),
        sorted({round(i * (n - 1) / max(1, k - 1)) for i in range(k)}) if k > 1 else [0],
    ]
    return edges + [sorted(rng.sample(range(n), k)) for _ in range(count)]


def noise_free(rng: random.Random, sets: dict[int, int]) -> bool:
    print("\nNoise-free: predicate calls to find the culprits among n items; the goal is on the max")
    print(
        "(limit: the n = 10,000 limits 15 / 34 / 66 for k = 1 / 2 / 4, as the same multiple of each bound)\n"
    )
    header = (
        f"{'n':>7} {'k':>2} {'needs':>5} {'sets':>5} | {'bound':>5} {'limit':>5} | "
        f"{'ours mean':>9} {'max':>4} {'max/bound':>9} | {'ddmin mean':>10} {'max':>4} | ok"
    )
    print(header)
    print("-" * len(header))
    goals: list[tuple[str, str, str, bool]] = []
    reductions = 0
    problems: list[str] = []
    for n in SIZES:
        for needs_all, ks in ((True, (1, 2, 4)), (False, (2, 4))):
            for k in ks:
                ours: list[int] = []
                theirs: list[int] = []
                for culprits in culprit_sets(rng, n, k, sets[n]):
                    failure = Failure(n, culprits, needs_all=needs_all)
                    reducer = SubsetReducer(failure)
                    found = reducer.reduce(range(n))
                    problems += [f"n={n} k={k}: {p}" for p in failure.problems(found)]
                    if reducer.calls != len(failure.asked):
                        problems.append(
                            f"n={n} k={k}: {reducer.calls} calls counted, {len(failure.asked)} asked"
                        )
                    ours.append(reducer.calls)
                    _, calls = ddmin(range(n), Failure(n, culprits, needs_all=needs_all))
                    theirs.append(calls)
                    reductions += 1
                # One culprit of several suffices: the information to find is that of one culprit.
                b, cap = (bound(n, k), limit(n, k)) if needs_all else (bound(n, 1), limit(n, 1))
                ok = max(ours) <= cap + 1e-9
                needs = "all" if needs_all else "any"
                goals.append((f"n={n:,} k={k} (needs {needs}) max calls", f"{max(ours)}", f"{cap:.1f}", ok))
                print(
                    f"{n:>7,} {k:>2} {needs:>5} {len(ours):>5} | {b:>5.1f} {cap:>5.1f} | "
                    f"{statistics.mean(ours):>9.1f} {max(ours):>4} {max(ours) / b:>9.2f} | "
                    f"{statistics.mean(theirs):>10.1f} {max(theirs):>4} | {'ok' if ok else 'MISSED'}"
                )
    print(
        "\n(needs any: the failure needs any one of k culprits; one of them must come back, within the"
        "\n one-culprit limit. ddmin: Zeller & Hildebrandt's, memoized, the baseline.)\n"
    )
    for text in problems[:10]:
        print(f"  problem: {text}")
    passed = all([check(what, fig, "<=", target, ok) for what, fig, target, ok in goals])
    return (
        check(
            f"exact, 1-minimal, whole input never asked, no subset twice ({reductions:,} reductions): "
            "violations",
            f"{len(problems)}",
            "==",
            "0",
            not problems,
        )
        and passed
    )


class SimulatedReplayer:
    """Stands in for `Replayer`: the whole bundle, or a candidate that keeps every culprit,
    reproduces with probability `rate`; anything else passes."""

    def __init__(self, n: int, culprits: Sequence[int], rate: float, rng: random.Random) -> None:
        self.manifest = SimpleNamespace(
            data=[SimpleNamespace(path=DATA, reducible=True, items=n)],
            command=SimpleNamespace(argv=("python", "train.py")),
        )
        self._culprits = sorted(culprits)
        self._rate = rate
        self._rng = rng
        self._last: tuple[Variant | None, bool] = (None, True)

    def run(self, variant: Variant | None = None) -> SimpleNamespace:
        if variant is None or variant.data is None:
            holds = True
        elif variant is self._last[0]:
            holds = self._last[1]  # the same candidate replayed again: same items
        else:
            kept = variant.data[DATA]
            holds = all(_contains(kept, c) for c in self._culprits)
            self._last = (variant, holds)
        reproduced = holds and self._rng.random() < self._rate
        return SimpleNamespace(outcome=Outcome.REPRODUCED if reproduced else Outcome.PASSED)


class SimulatedMinimizer(BundleMinimizer):
    """The real `BundleMinimizer.run`, except that the minimal bundle is kept, not written."""

    kept: list[int] | None = None

    def _write(
        self, subsets: dict[str, list[int]], argv: list[str], args: dict[str, tuple[str, str]]
    ) -> MinimizeResult:
        self.kept = list(subsets[DATA])
        return MinimizeResult(bundle_id="simulated", oracle_calls=self.oracle_calls, replays=self.replays)


def noisy_trial(rng: random.Random, rate: float, n: int, k: int) -> tuple[bool, bool, int, int] | None:
    """(exact, triage would minimize, verdict replays, minimization replays); None when the verdict
    never saw a reproduction (nothing to minimize)."""
    test = SequentialTest(VerdictPolicy())
    while not test.done:
        test.add(Outcome.REPRODUCED if rng.random() < rate else Outcome.PASSED)
    verdict = test.result()
    if verdict.reproductions == 0:
        return None
    culprits = rng.sample(range(n), k)
    replayer = SimulatedReplayer(n, culprits, rate, rng)
    minimizer = SimulatedMinimizer(
        cast(Store, None),
        cast(Any, replayer),
        "simulated",
        verdict.reproductions,
        verdict.reproductions + verdict.passes,
    )
    try:
        minimizer.run()
        exact = minimizer.kept == sorted(culprits)
    except MinimizeError:  # the confirmation did not reproduce: no minimal bundle
        exact = False
    return exact, should_minimize(cast(Any, replayer.manifest), verdict), verdict.replays, minimizer.replays


def p95(values: list[int]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1] if len(values) > 1 else values[0]


def noisy(rng: random.Random, trials: int, n: int, k: int) -> bool:
    print(
        f"\nNoisy: the whole path, {trials:,} trials per failure rate, n = {n:,} items, k = {k} culprits "
        f"needed together\n(SequentialTest on Bernoulli replays; BundleMinimizer: a failure that "
        f"reproduced every time trusted, single runs, checks at {TRUST_CHECK_RUNS} runs; else "
        f"NoisyOracle: search questions at {SEARCH_ERROR:.0%} each, the answer confirmed at "
        f"{DEFAULT_ERROR:.0%})\n"
    )
    header = (
        f"{'rate':>4} | {'exact':>7} {'95% CI low':>10} | {'verdict':>7} | "
        f"{'minimize mean':>13} {'p95':>5} | "
        f"{'total mean':>10} {'p95':>5} | {'triage minimizes':>16} | {'s':>4}"
    )
    print(header)
    print("-" * len(header))
    goals = []
    for rate in NOISY_RATES:
        start = time.perf_counter()
        results = [noisy_trial(rng, rate, n, k) for _ in range(trials)]
        done = [r for r in results if r is not None]
        exact = sum(r[0] for r in done)
        low, _ = clopper_pearson(exact, len(done), 0.95)
        verdict = [r[2] for r in done]
        minimize = [r[3] for r in done]
        total = [r[2] + r[3] for r in done]
        share = exact / len(done)
        minimizes = sum(r[1] for r in done) / len(done)
        skipped = f" ({len(results) - len(done)} never reproduced)" if len(done) < len(results) else ""
        print(
            f"{rate:>4.1f} | {share:>7.2%} {low:>10.2%} | {statistics.mean(verdict):>7.1f} | "
            f"{statistics.mean(minimize):>13.1f} {p95(minimize):>5.0f} | "
            f"{statistics.mean(total):>10.1f} {p95(total):>5.0f} | {minimizes:>16.0%} | "
            f"{time.perf_counter() - start:>4.0f}{skipped}"
        )
        goals.append((rate, share, low, exact, len(done)))
    print(
        "\n(exact: the minimal set is exactly the culprits; 95% CI low: the Clopper–Pearson interval's low"
        "\n end; verdict / minimize / total: replays per trial; triage minimizes: the share of trials"
        "\n `triage --minimize` would minimize at all, since it skips flaky failures below rate 0.5 —"
        "\n the others are minimized here anyway, to measure the minimizer at that rate.)\n"
    )
    return all(
        [
            check(
                f"rate {rate:.1f}: exact minimal set in {exact:,}/{count:,} trials",
                f"{share:.2%} (95% CI low {low:.2%})",
                ">=",
                f"{NOISY_EXACT_GOAL:.0%}",
                share >= NOISY_EXACT_GOAL,
            )
            for rate, share, low, exact, count in goals
        ]
    )


PROGRAM = """\\
import csv, os, random, socket
counter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
counter.sendto(b"run", os.environ["MINIMIZE_BENCH_COUNTER"])
ids = {{int(row["id"]) for row in csv.DictReader(open("rows.csv", newline=""))}}
if {culprits!r} <= ids and random.Random(os.urandom(8)).random() < {rate!r}:
    raise SystemExit("rows {culprits} conflict")
"""
E2E_ROWS = 10_000
E2E_NOISY_RATE = 0.7
E2E_NOISY_K = 2


class RunCounter:
    """Counts the datagrams `prog.py` sends, one per run, on a socket outside every sandbox."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(str(path))
        self._socket.settimeout(0.2)
        self._count = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                self._socket.recv(64)
            except TimeoutError:
                continue
            with self._lock:
                self._count += 1

    def settled(self) -> int:
        """The count once no datagram has arrived for a while (the senders have all exited)."""
        last = -1
        while True:
            time.sleep(0.3)
            with self._lock:
                if self._count == last:
                    return last
                last = self._count

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()


def _cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "flaketriage", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def _kept_rows(store_dir: Path, bundle: str) -> list[int]:
    store = LocalStore(store_dir)
    blob = load_manifest(store, bundle).data[0].blob
    assert blob is not None
    text = store.get_bytes(blob.sha256).decode()
    return sorted(int(row["id"]) for row in csv.DictReader(io.StringIO(text)))


def e2e_case(counter: RunCounter, culprits: list[int], rate: float) -> dict[str, Any]:
    """Capture and triage one failing program; what the triage cost and what it kept."""
    # The project in the system's temporary directory, outside any checkout (a capture inside one
    # would take the checkout as its source), and the counter's socket elsewhere (`end_to_end`).
    project = Path(tempfile.mkdtemp(prefix="flaketriage-bench-case-"))
    with open(project / "rows.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "value"])
        writer.writerows([i, i * 7919 % 10_007] for i in range(E2E_ROWS))
    (project / "prog.py").write_text(PROGRAM.format(culprits=set(culprits), rate=rate))
    env = {**os.environ, "MINIMIZE_BENCH_COUNTER": str(counter.path), "PYTHONPATH": str(ROOT)}
    store = project.parent / f"{project.name}-store"
    capture = ["capture", "--store", str(store), "--json", "--data", "rows.csv", "--", "python", "prog.py"]
    for _ in range(20):  # at rate < 1 a capture may pass: run it again, as CI would next time
        captured = json.loads(_cli(*capture, cwd=project, env=env).stdout or "{}")
        if captured.get("bundle"):
            break
    else:
        raise SystemExit(f"prog.py never failed with culprits {culprits} at rate {rate}")
    before = counter.settled()
    done = _cli(
        "triage", captured["bundle"], "--store", str(store), "--minimize", "--json", cwd=project, env=env
    )
    runs = counter.settled() - before
    result = json.loads(done.stdout)
    shutil.rmtree(project)
    minimal = result.get("minimal_bundle")
    kept = _kept_rows(store, minimal) if minimal else None
    shutil.rmtree(store)
    reducer = SubsetReducer(Failure(E2E_ROWS, culprits))
    reducer.reduce(range(E2E_ROWS))
    return {
        "verdict": result["verdict"],
        "verdict_replays": result["replays"],
        "minimize_runs": runs - result["replays"],
        "reducer": reducer.calls,
        "exact": kept == sorted(culprits),
        "minimized": minimal is not None,
        "error": result.get("minimize_error"),
    }


def end_to_end(rng: random.Random, scratch_root: Path, sets: int, noisy_trials: int) -> bool:
    print(
        f"\nEnd to end: `flaketriage capture --data rows.csv` + `flaketriage triage --minimize`, "
        f"{E2E_ROWS:,} rows;\nruns counted by the program itself, minus the verdict's replays "
        "(the reducer alone: the same culprits, noise-free predicate)\n"
    )
    header = (
        f"{'rate':>4} {'k':>2} {'cases':>5} | {'bound':>5} {'goal':>4} | {'reducer max':>11} | "
        f"{'end to end mean':>15} {'max':>4} | {'exact':>6} | {'s':>4}"
    )
    print(header)
    print("-" * len(header))
    if Path("/tmp") in scratch_root.resolve().parents or scratch_root.resolve() == Path("/tmp"):
        print(f"  the scratch directory {scratch_root} is under /tmp, which replays see as their own")
        return False
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-minimize-", dir=scratch_root))
    counter = RunCounter(scratch / "runs.sock")
    goals: list[tuple[str, str, str, str, bool]] = []
    try:
        # Quick: the culprits spread to both ends (the most calls) and one random set; else every edge.
        plan = [(1.0, k, culprit_sets(rng, E2E_ROWS, k, sets)[0 if sets > 1 else 3 :]) for k in (1, 2, 4)]
        noisy_sets = [sorted(rng.sample(range(E2E_ROWS), E2E_NOISY_K)) for _ in range(noisy_trials)]
        plan.append((E2E_NOISY_RATE, E2E_NOISY_K, noisy_sets))
        for rate, k, cases in plan:
            start = time.perf_counter()
            results = [e2e_case(counter, culprits, rate) for culprits in cases]
            done = [r for r in results if r["minimized"] or r["error"]]
            runs = [r["minimize_runs"] for r in done]
            exact = sum(r["exact"] for r in done)
            print(
                f"{rate:>4.1f} {k:>2} {len(done):>5} | {bound(E2E_ROWS, k):>5.1f} "
                f"{LIMITS[k] if rate == 1.0 else '-':>4} | "
                f"{max(r['reducer'] for r in done):>11} | {statistics.mean(runs):>15.1f} {max(runs):>4} | "
                f"{exact:>2}/{len(done):<3} | {time.perf_counter() - start:>4.0f}"
            )
            for r in results:
                if r["error"] or not r["exact"]:
                    print(f"    {r['verdict']}: kept the wrong rows or none ({r['error']})")
            reducer_max = max(r["reducer"] for r in done)
            if rate == 1.0:
                goals.append(
                    (
                        f"k={k}: most runs to minimize end to end (reducer alone {reducer_max})",
                        f"{max(runs)}",
                        "<=",
                        f"{LIMITS[k]}",
                        max(runs) <= LIMITS[k],
                    )
                )
                goals.append(
                    (
                        f"k={k}: exact minimal rows",
                        f"{exact}/{len(done)}",
                        "==",
                        f"{len(done)}",
                        exact == len(done),
                    )
                )
            else:
                _, high = clopper_pearson(exact, len(done), 0.95)
                skipped = len(results) - len(done)
                goals.append(
                    (
                        f"rate {rate}: exact minimal rows in {exact}/{len(done)} minimized"
                        f" ({skipped} not minimized by triage), 95% CI high",
                        f"{high:.2%}",
                        ">=",
                        f"{NOISY_EXACT_GOAL:.0%}",
                        high >= NOISY_EXACT_GOAL,
                    )
                )
    finally:
        counter.close()
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    return all([check(*goal) for goal in goals])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer culprit sets and noisy trials")
    parser.add_argument("--trials", type=int, default=None, help="noisy trials per rate (1,000; quick 200)")
    parser.add_argument("--n", type=int, default=1_000, help="items in the noisy part")
    parser.add_argument("--k", type=int, default=2, help="culprits in the noisy part")
    parser.add_argument("--seed", type=int, default=20240501)
    parser.add_argument(
        "--scratch", type=Path, default=ROOT / ".flaketriage", help="end-to-end scratch, outside /tmp"
    )
    parser.add_argument("--no-e2e", action="store_true", help="skip the end-to-end part")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    sets = {1_000: 60, 10_000: 20, 100_000: 4} if args.quick else {1_000: 400, 10_000: 150, 100_000: 25}
    trials = args.trials or (200 if args.quick else 1_000)
    started = time.perf_counter()
    exact = noise_free(rng, sets)
    noise = noisy(rng, trials, args.n, args.k)
    e2e = args.no_e2e or end_to_end(rng, args.scratch, 1 if args.quick else 3, 3 if args.quick else 10)
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    return 0 if exact and noise and e2e else 1


if __name__ == "__main__":
    sys.exit(main())
