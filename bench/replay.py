"""Replay overhead: materialize a bundle + start the sandbox, as a ratio to running the command directly.

Captures a small real program (a few source files, a 5,000-row CSV) once, then times N runs of the
command run directly in its directory against N replays through the Replayer (a private workspace
copy, the deterministic environment, the sandbox), for each sandbox available here. Prints medians
side by side.

    python bench/replay.py [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flaketriage.bundle import load_manifest
from flaketriage.ci.capture import CaptureRequest, run_and_capture
from flaketriage.ci.source import SourceLimits
from flaketriage.store import LocalStore
from flaketriage.workers.materialize import materialize
from flaketriage.workers.replay import ReplayContext, Replayer
from flaketriage.workers.sandbox import BubblewrapSandbox, ProcessSandbox, Sandbox, bwrap_path

PROGRAM = """
import csv
rows = list(csv.DictReader(open("data/rows.csv")))
total = sum(float(r["v"]) for r in rows)
raise SystemExit(f"checksum mismatch: {total:.3f}")
"""


def _project(root: Path) -> None:
    (root / "data").mkdir(parents=True)
    (root / "main.py").write_text(PROGRAM)
    for i in range(20):
        (root / f"module_{i}.py").write_text(f"VALUE = {i}\n" * 50)
    (root / "data" / "rows.csv").write_text("id,v\n" + "".join(f"{i},{i * 0.5}\n" for i in range(5000)))


def _time(fn: object, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "project"
        _project(root)
        store = LocalStore(Path(tmp) / "store")
        request = CaptureRequest(
            argv=[sys.executable, "main.py"],
            cwd=root,
            limits=SourceLimits(max_file_bytes=10 << 20, max_total_bytes=200 << 20),
            data=[Path("data/rows.csv")],
            snapshot=True,
            echo=False,
        )
        captured = run_and_capture(store, request)
        assert captured.bundle_id
        manifest = load_manifest(store, captured.bundle_id)

        direct = _time(
            lambda: subprocess.run([sys.executable, "main.py"], cwd=root, capture_output=True, check=False),
            args.runs,
        )
        counter = iter(range(10**6))
        context = ReplayContext.from_process()
        materialize_times = _time(
            lambda: materialize(store, manifest, Path(tmp) / f"m{next(counter)}", git=context.git),
            max(3, args.runs // 4),
        )
        sandboxes: list[Sandbox] = [ProcessSandbox()]
        if bwrap_path():
            sandboxes.append(BubblewrapSandbox())
        base = statistics.median(direct)
        print(f"{'what':40} {'median ms':>10} {'ratio':>7}")
        print(f"{'command run directly (baseline)':40} {base * 1000:10.1f} {1.0:7.2f}")
        med_mat = statistics.median(materialize_times)
        print(f"{'materialize bundle (once per triage)':40} {med_mat * 1000:10.1f} {med_mat / base:7.2f}")
        for sandbox in sandboxes:
            with Replayer(store, manifest, sandbox, context=context) as replayer:
                outcome = replayer.run().outcome
                replays = _time(replayer.run, args.runs)
            med = statistics.median(replays)
            label = f"replay in {sandbox.name} sandbox ({outcome})"
            print(f"{label:40} {med * 1000:10.1f} {med / base:7.2f}")


if __name__ == "__main__":
    main()
