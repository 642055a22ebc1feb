"""Benchmark: ``flaketriage triage BUNDLE`` as a user runs it, against running the command directly
as many times as triage replays it.

Captures a small real program once (20 source files and a 5,000-row CSV; it fails the same way
every time, so triage replays it 5 times and calls it deterministic), with ``flaketriage capture``.
Then, round by round in a fresh random order after a warm-up round, it times:

* ``direct``: the command run directly in its directory, R times (R = the replays triage made), a
  new process each, one after another: the baseline, what rerunning it by hand costs;
* ``direct (A/A)``: the same again, to show the noise;
* ``triage (SANDBOX)``: the whole ``flaketriage triage BUNDLE --sandbox SANDBOX --json`` process
  (the CLI's start, materialization, the sandbox, all R replays, the report), for each sandbox
  that works here (``process``, and ``bwrap`` when bubblewrap is installed).

Printed per variant: the median seconds, the median per-pair ratio to ``direct`` with its
quartiles and range, and the median per-pair added seconds (per triage, and shared out per
replay). Goal: a triage adds at most ``GOAL_ADDED_S`` (2 s) to the R direct runs, in every sandbox
that works here. The ratio depends on how long the command takes (this one takes tens of
milliseconds, so the fixed costs dominate it); the added seconds do not. Exits 1 on a miss.

A second part (``--part environment``) times replays in the bundle's own environment: a
5-second command that imports a package pinned in the bundle (a wheel built here, installed from a
local ``--find-links`` directory, no network), triaged with ``FLAKETRIAGE_ENVIRONMENT=bundle`` and
one replay (``--max-replays 1``), so the whole CLI (its start, materialization, the environment
from a warm cache, the sandbox's start, the report) is compared with running the command once by
hand. Goals, in each sandbox that works here (``process``, ``bwrap``, ``docker`` when an engine
answers): at most ``GOAL_ENV_RATIO`` (1.2×) the direct run and under ``GOAL_ENV_ADDED_S`` (1 s)
added. The cold build of the environment (the first triage, an empty cache) is printed beside it.

    python bench/replay.py [--quick] [--rounds 10] [--part all|triage|environment]

To compare another way of replaying, add a variant to `variants()` or `environment_variants()`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check
from paired import Spread, interleave, noise_floor

PROGRAM = """
import csv
rows = list(csv.DictReader(open("data/rows.csv")))
total = sum(float(r["v"]) for r in rows)
raise SystemExit(f"checksum mismatch: {total:.3f}")
"""
SANDBOXES = ("process", "bwrap")
GOAL_ADDED_S = 2.0
"""Most seconds a whole triage may add to running the command as many times by hand: the CLI's
start, materialization, environment checks, a sandbox per replay and the report, together a
couple of seconds, small beside the replays of a real test or training run. Set with this
benchmark; no earlier figure existed."""
DIRECT, AA = "direct", "direct (A/A)"


def make_project(root: Path) -> None:
    (root / "data").mkdir(parents=True)
    (root / "main.py").write_text(PROGRAM)
    for i in range(20):
        (root / f"module_{i}.py").write_text(f"VALUE = {i}\n" * 50)
    (root / "data" / "rows.csv").write_text("id,v\n" + "".join(f"{i},{i * 0.5}\n" for i in range(5000)))


def flaketriage_command() -> list[str]:
    """The console script a user runs, from this interpreter's environment."""
    script = Path(sys.executable).parent / "flaketriage"
    return [str(script)] if script.exists() else [sys.executable, "-m", "flaketriage"]


def capture(root: Path, store: Path, env: dict[str, str]) -> str:
    command = [sys.executable, "main.py"]
    done = subprocess.run(
        [
            *flaketriage_command(),
            "capture",
            "--store",
            str(store),
            "--json",
            "--data",
            "data/rows.csv",
            "--",
            *command,
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    bundle = json.loads(done.stdout.strip().splitlines()[-1])["bundle"]
    if not bundle:
        raise SystemExit(f"capture stored no bundle:\n{done.stdout}{done.stderr}")
    return str(bundle)


def triage_runner(
    bundle: str, store: Path, sandbox: str, root: Path, env: dict[str, str]
) -> Callable[[], tuple[float, int]]:
    """One whole triage, as a user runs it: (seconds, replays it made)."""
    argv = [*flaketriage_command(), "triage", bundle, "--store", str(store), "--sandbox", sandbox, "--json"]

    def run() -> tuple[float, int]:
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        try:
            result = json.loads(done.stdout)
        except json.JSONDecodeError:
            raise SystemExit(
                f"triage --sandbox {sandbox} printed no result:\n{done.stdout}{done.stderr}"
            ) from None
        if result["verdict"] != "deterministic":
            raise SystemExit(f"triage --sandbox {sandbox} said {result['verdict']}, expected deterministic")
        return seconds, int(result["replays"])

    return run


def direct_runner(root: Path, times: int, env: dict[str, str]) -> Callable[[], tuple[float, int]]:
    """The command run directly `times` times in a row: (seconds, runs)."""

    def run() -> tuple[float, int]:
        start = time.perf_counter()
        for _ in range(times):
            done = subprocess.run(
                [sys.executable, "main.py"], cwd=root, env=env, capture_output=True, check=False
            )
            if done.returncode == 0:
                raise SystemExit("the program passed when run directly; it should fail")
        return time.perf_counter() - start, times

    return run


def usable_sandboxes(bundle: str, store: Path, root: Path, env: dict[str, str]) -> dict[str, str]:
    """Sandbox → why it is skipped here ("" when usable)."""
    out = {}
    for sandbox in SANDBOXES:
        if sandbox == "bwrap" and shutil.which("bwrap") is None:
            out[sandbox] = "bwrap is not installed (apt-get install bubblewrap)"
            continue
        try:
            triage_runner(bundle, store, sandbox, root, env)()
            out[sandbox] = ""
        except SystemExit as exc:
            out[sandbox] = str(exc).splitlines()[0]
    return out


def variants(
    bundle: str, store: Path, root: Path, env: dict[str, str], replays: int, sandboxes: list[str]
) -> dict[str, Callable[[], tuple[float, int]]]:
    """Everything timed in a round, by name: the baseline first."""
    out = {DIRECT: direct_runner(root, replays, env), AA: direct_runner(root, replays, env)}
    for sandbox in sandboxes:
        out[f"triage ({sandbox})"] = triage_runner(bundle, store, sandbox, root, env)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (10; --quick 4)")
    parser.add_argument("--quick", action="store_true", help="4 rounds: a smoke run, noisier")
    parser.add_argument("--part", choices=("all", "triage", "environment"), default="all")
    args = parser.parse_args()
    ok = True
    if args.part in ("all", "triage"):
        ok = triage_part(args.rounds or (4 if args.quick else 10)) and ok
    if args.part in ("all", "environment"):
        ok = environment_part(args.rounds or (3 if args.quick else 6)) and ok
    return 0 if ok else 1


def triage_part(rounds: int) -> bool:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    with tempfile.TemporaryDirectory(prefix="flaketriage-bench-") as tmp:
        root = Path(tmp) / "project"
        store = Path(tmp) / "store"
        make_project(root)
        bundle = capture(root, store, env)
        status = usable_sandboxes(bundle, store, root, env)
        sandboxes = [s for s, why in status.items() if not why]
        if not sandboxes:
            raise SystemExit(f"no sandbox works here: {status}")
        _, replays = triage_runner(bundle, store, sandboxes[0], root, env)()
        runs = interleave(variants(bundle, store, root, env, replays, sandboxes), rounds)

    seconds = {name: [s for s, _ in measured] for name, measured in runs.items()}
    counts = {name: {n for _, n in measured} for name, measured in runs.items()}
    base = seconds[DIRECT]
    noise = noise_floor(Spread.ratios(seconds[AA], base))
    print(
        f"\n`flaketriage triage` (the whole command) against the command run directly {replays} times "
        f"(the replays triage made);\n{rounds} interleaved rounds after a warm-up, per-pair ratios and "
        f"differences to `{DIRECT}`\n"
    )
    header = f"{'variant':<18} {'median s':>8} | {'ratio to direct':<46} | {'added s':>7} {'per replay':>10}"
    print(header)
    print("-" * len(header))
    results = []
    for name, times in seconds.items():
        if name == DIRECT:
            print(f"{name:<18} {statistics.median(times):>8.3f} | {'(baseline)':<46} |")
            continue
        ratios = Spread.ratios(times, base)
        added = Spread.differences(times, base).median
        print(
            f"{name:<18} {statistics.median(times):>8.3f} | {ratios.ratio_text():<46} | "
            f"{added:>7.3f} {added / replays:>10.3f}"
        )
        if name.startswith("triage") and counts[name] != {replays}:
            raise SystemExit(f"{name} made {sorted(counts[name])} replays, expected {replays} every time")
        if name.startswith("triage ("):
            sandbox = name[len("triage (") : -1]
            results.append((sandbox, ratios, added))
    for sandbox, why in status.items():
        if why:
            print(f"{f'triage ({sandbox})':<18} skipped: {why}")
    print(
        f"\nnoise floor (A/A quartiles): ±{noise:.1%} of the direct runs' {statistics.median(base):.2f} s\n"
    )
    ok = [
        check(
            f"triage --sandbox {sandbox} ({ratios.median:.2f}x direct, {added / replays:.2f} s per replay), "
            "added seconds per triage",
            f"{added:.2f}",
            "<=",
            f"{GOAL_ADDED_S:.2f}",
            added <= GOAL_ADDED_S,
        )
        for sandbox, ratios, added in results
    ]
    return all(ok)


# -- replays in the bundle's environment --------------------------------------------------------
ENV_COMMAND_S = 5.0
ENV_PROGRAM = f"""
import time
import ftbench_pinned
time.sleep({ENV_COMMAND_S})
raise SystemExit(f"fatal: the job failed with ftbench_pinned {{ftbench_pinned.__version__}}")
"""
ENV_SANDBOXES = ("process", "bwrap", "docker")
GOAL_ENV_RATIO = 1.2
"""A triage of one replay of a 5-second command against running it once by hand (the issue's goal)."""
GOAL_ENV_ADDED_S = 1.0
"""Seconds a triage of one replay may add, with the bundle's environment cached (the issue's goal)."""


def _wheel(directory: Path, name: str, version: str) -> None:
    """A pure-Python wheel of one module, built here so that no index is needed."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name}-{version}"
    files = {
        f"{name}.py": f"__version__ = {version!r}\n",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(directory / f"{dist}-py3-none-any.whl", "w") as z:
        for member, text in files.items():
            data = text.encode()
            z.writestr(member, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{member},sha256={digest},{len(data)}")
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n")


def environment_bundle(
    tmp: Path, env: dict[str, str]
) -> tuple[Path, Path, str, dict[str, str], dict[str, str]]:
    """(project, store, bundle, the direct runs' environment): a capture whose recorded freeze is
    just the pinned package, and a direct run that imports the same module from a plain directory."""
    from flaketriage.bundle.io import load_manifest, write_bundle
    from flaketriage.store import LocalStore

    root, store, wheels, site = tmp / "env-project", tmp / "env-store", tmp / "wheels", tmp / "direct-site"
    for directory in (root, wheels, site):
        directory.mkdir(parents=True)
    (root / "main.py").write_text(ENV_PROGRAM)
    _wheel(wheels, "ftbench_pinned", "1.0")
    (site / "ftbench_pinned.py").write_text("__version__ = '1.0'\n")
    direct_env = {**env, "PYTHONPATH": str(site)}
    bundle = capture_plain(root, store, direct_env)
    local = LocalStore(store)
    manifest = load_manifest(local, bundle)
    command = manifest.command.model_copy(
        update={"env": {k: v for k, v in manifest.command.env.items() if k != "PYTHONPATH"}}
    )
    recorded = manifest.environment.model_copy(update={"packages": ("ftbench-pinned==1.0",)})
    bundle = write_bundle(local, manifest.model_copy(update={"command": command, "environment": recorded}))
    triage_env = {
        **env,
        "FLAKETRIAGE_ENVIRONMENT": "bundle",
        "FLAKETRIAGE_ENVIRONMENT_CACHE_DIR": str(tmp / "environments"),
        "FLAKETRIAGE_MAX_REPLAYS": "1",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
    }
    return root, store, bundle, direct_env, triage_env


def capture_plain(root: Path, store: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [*flaketriage_command(), "capture", "--store", str(store), "--json", "--", sys.executable, "main.py"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    bundle = json.loads(done.stdout.strip().splitlines()[-1])["bundle"]
    if not bundle:
        raise SystemExit(f"capture stored no bundle:\n{done.stdout}{done.stderr}")
    return str(bundle)


def environment_triage(
    bundle: str, store: Path, sandbox: str, root: Path, env: dict[str, str]
) -> Callable[[], tuple[float, dict[str, object]]]:
    """One whole triage of one replay in the bundle's environment: (seconds, its environment)."""
    argv = [*flaketriage_command(), "triage", bundle, "--store", str(store), "--sandbox", sandbox, "--json"]

    def run() -> tuple[float, dict[str, object]]:
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
        try:
            result = json.loads(done.stdout)
        except json.JSONDecodeError:
            shown = f"{done.stdout}{done.stderr}"
            raise SystemExit(f"triage --sandbox {sandbox} printed no result:\n{shown}") from None
        environment = result.get("environment") or {}
        if result["failures"] != 1 or environment.get("mode") != "bundle" or environment.get("error"):
            raise SystemExit(
                f"triage --sandbox {sandbox} did not reproduce in the bundle's environment: "
                f"{result['verdict']}, {result['findings']}, {environment}"
            )
        return seconds, environment

    return run


CLI_START = "CLI start + direct"


def cli_start_runner(root: Path, env: dict[str, str]) -> Callable[[], tuple[float, int]]:
    """``flaketriage --version`` (the console script's start: Python, imports), then the direct run."""
    direct = direct_runner(root, 1, env)

    def run() -> tuple[float, int]:
        start = time.perf_counter()
        subprocess.run(
            [*flaketriage_command(), "--version"], cwd=root, env=env, capture_output=True, check=True
        )
        started = time.perf_counter() - start
        return started + direct()[0], 1

    return run


def environment_part(rounds: int) -> bool:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    with tempfile.TemporaryDirectory(prefix="flaketriage-bench-env-") as tmp:
        root, store, bundle, direct_env, triage_env = environment_bundle(Path(tmp), env)
        cold_s, cold = environment_triage(bundle, store, "process", root, triage_env)()
        status: dict[str, str] = {}
        for sandbox in ENV_SANDBOXES:
            if sandbox == "bwrap" and shutil.which("bwrap") is None:
                status[sandbox] = "bwrap is not installed (apt-get install bubblewrap)"
                continue
            try:
                environment_triage(bundle, store, sandbox, root, triage_env)()  # warms its cache too
                status[sandbox] = ""
            except SystemExit as exc:
                lines = [line for line in str(exc).splitlines() if line.strip()]
                status[sandbox] = " ".join(lines[:1] + lines[-1:])[:300]
        sandboxes = [s for s, why in status.items() if not why]
        measured: dict[str, Callable[[], tuple[float, int]]] = {
            DIRECT: direct_runner(root, 1, direct_env),
            AA: direct_runner(root, 1, direct_env),
        }
        # Not a goal: how much of what a triage adds is the CLI's own start, whatever it runs.
        measured[CLI_START] = cli_start_runner(root, direct_env)
        for sandbox in sandboxes:
            runner = environment_triage(bundle, store, sandbox, root, triage_env)
            measured[f"triage ({sandbox})"] = lambda runner=runner: (runner()[0], 1)  # type: ignore[misc]
        runs = interleave(measured, rounds)

    seconds = {name: [s for s, _ in values] for name, values in runs.items()}
    base = seconds[DIRECT]
    noise = noise_floor(Spread.ratios(seconds[AA], base))
    print(
        "\n`flaketriage triage --max-replays 1` in the bundle's environment "
        f"(FLAKETRIAGE_ENVIRONMENT=bundle, cached) against a {ENV_COMMAND_S:g}-second command run once "
        f"by hand;\n{rounds} interleaved rounds after a warm-up, per-pair ratios and differences to "
        f"`{DIRECT}`\n"
    )
    header = f"{'variant':<18} {'median s':>8} | {'ratio to direct':<46} | {'added s':>7}"
    print(header)
    print("-" * len(header))
    results = []
    for name, times in seconds.items():
        if name == DIRECT:
            print(f"{name:<18} {statistics.median(times):>8.3f} | {'(baseline)':<46} |")
            continue
        ratios, added = Spread.ratios(times, base), Spread.differences(times, base).median
        print(f"{name:<18} {statistics.median(times):>8.3f} | {ratios.ratio_text():<46} | {added:>7.3f}")
        if name.startswith("triage ("):
            results.append((name[len("triage (") : -1], ratios, added))
    for sandbox, why in status.items():
        if why:
            print(f"{f'triage ({sandbox})':<18} skipped: {why}")
    print(
        f"\ncold environment build (the first triage, empty cache): triage {cold_s:.2f} s, of which building "
        f"the environment {cold.get('build_s')} s ({cold.get('python')}, {cold.get('packages')} package)"
    )
    print(f"noise floor (A/A quartiles): ±{noise:.1%} of the direct runs' {statistics.median(base):.2f} s\n")
    ok = []
    for sandbox, ratios, added in results:
        ok.append(
            check(
                f"triage --sandbox {sandbox} in the bundle's environment (warm), ratio to direct",
                f"{ratios.median:.3f}",
                "<=",
                f"{GOAL_ENV_RATIO:.2f}",
                ratios.median <= GOAL_ENV_RATIO,
            )
        )
        ok.append(
            check(
                f"triage --sandbox {sandbox} in the bundle's environment (warm), added seconds",
                f"{added:.2f}",
                "<",
                f"{GOAL_ENV_ADDED_S:.2f}",
                added < GOAL_ENV_ADDED_S,
            )
        )
    return all(ok)


if __name__ == "__main__":
    sys.exit(main())
