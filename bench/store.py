"""Benchmark: capturing a training workspace into the store, against ``cp -r`` and ``sha256sum`` of
the same bytes, and ``bundle push`` against ``tar czf`` + one upload of the archive.

Run from the repository root: ``python bench/store.py [--quick] [--rounds 3] [--push-rounds 1]
[--no-s3]`` (3 to 5 minutes on a 2-core machine; ``--quick`` under 2).

The workspace: ``ckpt/model.bin``, a checkpoint of float32 weights (512 MB; ``--quick`` 64 MB: random
normal values, which zstd shrinks by under a tenth, so the store copies them), and 5,000 small
source files (``--quick`` 1,000: Python text of 0.3 to 6 KB, every tenth a binary blob). The command
timed is what a user runs, the whole process: ``python -m flaketriage capture --store S --snapshot
--data ckpt -- false`` in the workspace (the snapshot takes the small files, ``--data`` the
checkpoint). Its files are older than the stat cache's racy margin (2 s) when the rounds start.

Each round runs, in a fresh random order: ``cp -r`` of the workspace, ``cp -r`` again (the A/A row:
the same command against itself, which says how noisy this machine is), ``sha256sum`` of every
file, a capture sequence (the first capture into an empty store, an unchanged re-capture into it,
and the re-capture again: A/A for the re-capture), and a capture of an empty workspace, the floor
of any capture (the interpreter, imports, environment probes; the package's bytecode is compiled
first, as an install compiles it). Ratios are taken within a round;
the median and spread are printed. Dirty pages are written back (``sync``, not timed) between timed commands,
so no command pays for the previous one's writes; the page cache stays warm for every command.

Untimed, once: what a first capture reads and writes (``rchar``/``wchar`` of the capturing
process, less a capture of an empty workspace, the floor of imports and probes), and what an
unchanged re-capture adds to the store (objects and bytes) and writes at all.

With moto installed (and not ``--no-s3``): a moto server (``python -m moto.server``) stands in for
S3; each round (one by default: each side moves half a gigabyte through it) pushes the first
capture's bundle to a fresh prefix (``flaketriage bundle push ID --to s3://...``) and times ``tar
czf`` of the workspace plus one upload of the archive (boto3's ``upload_file``, in its own process,
as the push is), in random order; then pushes the bundle a second time, which must send no object
bytes.

Goals (exits 1 when one is missed): first capture <= 1.3x ``cp -r``, reading each byte once (read
<= 1.05x the workspace beyond the floor); re-capture <= 0.10x the first capture, adding one object
(its manifest, a few KB) and writing <= 1 MB; ``bundle push`` >= 3x faster than ``tar czf`` +
upload, and a second push sends 0 bytes.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from goals import check
from paired import Spread, noise_floor

MB = 1 << 20
CAPTURE = ["--snapshot", "--data", "ckpt", "--", "false"]
IO_WRAPPER = (
    "import atexit, os, runpy, sys\n"
    "out = os.environ['BENCH_IO']\n"
    "atexit.register(lambda: open(out, 'w').write(open('/proc/self/io').read()))\n"
    "sys.argv = ['flaketriage', *sys.argv[1:]]\n"
    "runpy.run_module('flaketriage', run_name='__main__', alter_sys=True)\n"
)


def build_workspace(root: Path, checkpoint_mb: int, files: int) -> int:
    """Write the workspace; returns its size in bytes."""
    (root / "ckpt").mkdir(parents=True)
    write_weights(root / "ckpt" / "model.bin", checkpoint_mb * MB)
    rng = random.Random(0)
    words = ["loss", "step", "batch", "model", "optimizer", "return", "self", "tensor", "grad", "x"]
    for i in range(files):
        pkg = root / "src" / f"pkg{i % 50:02d}"
        pkg.mkdir(parents=True, exist_ok=True)
        if i % 10 == 9:
            (pkg / f"blob{i}.bin").write_bytes(os.urandom(rng.randint(256, 4096)))
            continue
        lines = [
            f"def f{i}_{j}({rng.choice(words)}):\n    return {rng.choice(words)} + {j}\n" for j in range(4)
        ]
        body = "".join(lines) * rng.randint(1, 25)
        (pkg / f"mod{i}.py").write_text(f'"""Module {i}."""\n\n{body}')
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def write_weights(path: Path, size: int) -> None:
    """Float32 weights: random normal values (numpy), else random bytes whose exponents vary as
    little as trained weights' do."""
    try:
        import numpy as np
    except ImportError:
        np = None  # type: ignore[assignment]
    with path.open("wb") as fh:
        for start in range(0, size, 4 * MB):
            n = min(4 * MB, size - start)
            if np is not None:
                rng = np.random.default_rng(start)
                fh.write((rng.standard_normal(n // 4, dtype=np.float32) * 0.02).tobytes())
            else:
                block = bytearray(os.urandom(n))
                block[3::4] = b"\x3c\xbc\x3b\xbb" * (n // 16)
                fh.write(block)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKETRIAGE_")}
    env["PYTHONHASHSEED"] = "0"
    return env


def timed(argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> float:
    """Seconds `argv` took (the whole process); its dirty pages written back afterwards, untimed."""
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=1800, check=False)
    took = time.perf_counter() - start
    os.sync()
    if proc.returncode not in (0, 1):  # `false` fails on purpose: capture exits 1 with it
        raise SystemExit(f"{argv[:4]} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return took


def flaketriage(*args: str) -> list[str]:
    return [sys.executable, "-m", "flaketriage", *args]


def capture(store: Path) -> list[str]:
    """What a user runs: capture the workspace (the current directory) into `store`."""
    return flaketriage("capture", "--store", str(store), *CAPTURE)


def store_bytes(store: Path) -> dict[str, int]:
    objects = store / "objects"
    return {
        p.parent.name + p.name: p.stat().st_size for p in objects.glob("??/*") if not p.name.startswith(".")
    }


def process_io(argv: list[str], cwd: Path, env: dict[str, str], scratch: Path) -> dict[str, int]:
    """The I/O counters of one flaketriage process (not its children), read at its exit."""
    out = scratch / "io.txt"
    subprocess.run(
        [sys.executable, "-c", IO_WRAPPER, *argv],
        cwd=cwd,
        env={**env, "BENCH_IO": str(out)},
        capture_output=True,
        timeout=1800,
        check=False,
    )
    fields = dict(line.split(": ") for line in out.read_text().splitlines())
    return {k: int(v) for k, v in fields.items()}


def row(name: str, times: list[float], base: list[float] | None, note: str = "") -> None:
    median = statistics.median(times)
    ratio = f"  {Spread.ratios(times, base).ratio_text()}" if base is not None else ""
    print(f"  {name:<34} {median:8.3f} s{ratio}{note}")


# -- the rounds -----------------------------------------------------------------------------------
def run_rounds(work: Path, scratch: Path, rounds: int, workspace_bytes: int) -> tuple[bool, list[Path]]:
    env = child_env()
    times: dict[str, list[float]] = {k: [] for k in ("cp", "cp2", "sha", "first", "re", "re2", "floor")}
    stores: list[Path] = []
    files = sorted(str(p) for p in work.rglob("*") if p.is_file())

    def copy(key: str) -> Callable[[], None]:
        def run() -> None:
            dest = scratch / f"copy-{key}"
            times[key].append(timed(["cp", "-r", str(work), str(dest)]))
            shutil.rmtree(dest)

        return run

    def sha() -> None:
        times["sha"].append(timed(["sha256sum", *files]))

    def captures() -> None:
        store = scratch / f"store-{len(stores)}"
        stores.append(store)
        for key in ("first", "re", "re2"):
            times[key].append(timed(capture(store), cwd=work, env=env))

    empty = scratch / "empty"
    (empty / "ckpt").mkdir(parents=True)

    def floor() -> None:
        times["floor"].append(
            timed(capture(scratch / f"store-floor-{len(times['floor'])}"), cwd=empty, env=env)
        )

    variants: dict[str, Callable[[], None]] = {
        "cp": copy("cp"),
        "cp2": copy("cp2"),
        "sha": sha,
        "captures": captures,
        "floor": floor,
    }
    order = random.Random(1)
    for _ in range(rounds):
        for name in order.sample(list(variants), len(variants)):
            variants[name]()

    print(
        f"\nworkspace: {workspace_bytes / 1e6:.0f} MB in {len(files)} files; {rounds} rounds "
        "(median; ratio to the row it is paired with, per round)"
    )
    row("cp -r", times["cp"], None)
    row("cp -r again (A/A)", times["cp2"], times["cp"])
    row("sha256sum of every file", times["sha"], times["cp"], "  (to cp -r)")
    row("first capture", times["first"], times["cp"], "  (to cp -r)")
    row("unchanged re-capture", times["re"], times["first"], "  (to the first capture)")
    row("re-capture again (A/A)", times["re2"], times["re"])
    row("capture of an empty workspace", times["floor"], times["re"], "  (to the re-capture)")
    noise = noise_floor(Spread.ratios(times["cp2"], times["cp"]))
    beyond = Spread.differences(times["re"], times["floor"]).median
    print(
        f"  noise (cp -r A/A): ±{noise:.1%}; the re-capture takes {beyond:+.3f} s beyond an empty "
        "workspace's capture (the interpreter, imports, environment probes: the floor of any capture)"
    )
    first = Spread.ratios(times["first"], times["cp"]).median
    again = Spread.ratios(times["re"], times["first"]).median
    ok = check("first capture / cp -r", f"{first:.2f}x", "<=", "1.30x", first <= 1.30)
    ok &= check("unchanged re-capture / first capture", f"{again:.3f}x", "<=", "0.100x", again <= 0.10)
    return ok, stores


def io_checks(work: Path, scratch: Path, workspace_bytes: int) -> bool:
    env = child_env()
    empty = scratch / "empty"
    floor = process_io(capture(scratch / "io-floor")[3:], empty, env, scratch)
    store = scratch / "io-store"
    first = process_io(capture(store)[3:], work, env, scratch)
    before = store_bytes(store)
    again = process_io(capture(store)[3:], work, env, scratch)
    added = {k: v for k, v in store_bytes(store).items() if k not in before}
    read = (first["rchar"] - floor["rchar"]) / workspace_bytes
    print(
        f"\nfirst capture: read {first['rchar'] / 1e6:.1f} MB (an empty workspace's capture: "
        f"{floor['rchar'] / 1e6:.1f} MB), wrote {first['wchar'] / 1e6:.1f} MB; "
        f"re-capture: wrote {again['wchar'] / 1e3:.1f} kB, added {len(added)} object(s), "
        f"{sum(added.values()) / 1e3:.1f} kB"
    )
    ok = check("first capture bytes read / workspace", f"{read:.3f}x", "<=", "1.05x", read <= 1.05)
    ok &= check("re-capture objects added", str(len(added)), "<=", "1 (its manifest)", len(added) <= 1)
    ok &= check(
        "re-capture object bytes added",
        f"{sum(added.values()) / 1e3:.1f} kB",
        "<=",
        "64 kB",
        sum(added.values()) <= 64_000,
    )
    ok &= check(
        "re-capture bytes written",
        f"{again['wchar'] / 1e6:.3f} MB",
        "<=",
        "1 MB",
        again["wchar"] <= 1_000_000,
    )
    return ok


# -- bundle push ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def push_checks(work: Path, scratch: Path, store: Path, rounds: int) -> bool:
    import boto3
    import httpx

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server_env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FLAKETRIAGE_"))}
    log = (scratch / "moto.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=server_env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(endpoint + "/moto-api/", timeout=2, trust_env=False)
                break
            except httpx.HTTPError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("moto server did not start") from None
                time.sleep(0.1)
        creds = {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        client.create_bucket(Bucket="bench")
        env = {
            **child_env(),
            **creds,
            "FLAKETRIAGE_S3_ENDPOINT_URL": endpoint,
            "NO_PROXY": "127.0.0.1,localhost",
        }
        listed = subprocess.run(
            [*flaketriage("bundle", "list", "--json"), "--store", str(store)],
            env=env,
            capture_output=True,
            check=True,
        )
        bundle = json.loads(listed.stdout)[0]["id"]
        upload = (
            "import boto3, sys\n"
            f"boto3.session.Session().client('s3', endpoint_url={endpoint!r}, region_name='us-east-1')"
            ".upload_file(sys.argv[1], 'bench', sys.argv[2])\n"
        )
        times: dict[str, list[float]] = {"push": [], "tar": []}
        order = random.Random(2)
        for r in range(rounds):
            for name in order.sample(["push", "tar"], 2):
                if name == "push":
                    argv = [
                        *flaketriage("bundle", "push", bundle, "--to", f"s3://bench/r{r}"),
                        "--store",
                        str(store),
                    ]
                    times["push"].append(timed(argv, env=env))
                else:
                    archive = scratch / "workspace.tgz"
                    start = time.perf_counter()
                    subprocess.run(["tar", "czf", str(archive), "-C", str(work), "."], check=True)
                    subprocess.run(
                        [sys.executable, "-c", upload, str(archive), f"archive/{r}.tgz"], env=env, check=True
                    )
                    times["tar"].append(time.perf_counter() - start)
                    archive.unlink()
                    os.sync()
        second = subprocess.run(
            [
                *flaketriage("bundle", "push", bundle, "--to", "s3://bench/r0", "--json"),
                "--store",
                str(store),
            ],
            env=env,
            capture_output=True,
            check=True,
        )
        sent = json.loads(second.stdout)["bytes_sent"]
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    print(f"\nbundle push to a moto server ({rounds} rounds)")
    row("tar czf + upload", times["tar"], None)
    row("bundle push", times["push"], times["tar"], "  (to tar czf + upload)")
    faster = 1 / Spread.ratios(times["push"], times["tar"]).median
    ok = check("tar czf + upload / bundle push", f"{faster:.2f}x", ">=", "3.00x", faster >= 3.0)
    ok &= check("second push of the same bundle: bytes sent", str(sent), "==", "0", sent == 0)
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 64 MB checkpoint and 1,000 small files")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--push-rounds", type=int, default=None, help="default 1, --quick 2: a push is slow")
    parser.add_argument("--no-s3", action="store_true", help="leave out bundle push")
    args = parser.parse_args()
    checkpoint_mb, files = (64, 1000) if args.quick else (512, 5000)
    rounds = args.rounds or (2 if args.quick else 3)
    # The package's bytecode, as `pip install` compiles it: with PYTHONDONTWRITEBYTECODE set (as in
    # this project's CI) an editable checkout would compile every module again in every timed run.
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "flaketriage", quiet=1)
    scratch = Path(tempfile.mkdtemp(prefix="flaketriage-bench-store-"))
    try:
        work = scratch / "work"
        start = time.monotonic()
        size = build_workspace(work, checkpoint_mb, files)
        os.sync()
        time.sleep(max(0.0, 2.5 - (time.monotonic() - start)))  # past the stat cache's racy margin
        ok, stores = run_rounds(work, scratch, rounds, size)
        ok &= io_checks(work, scratch, size)
        try:
            import boto3  # noqa: F401
            import moto  # noqa: F401
        except ImportError:
            args.no_s3 = True
            print("\nbundle push: skipped (pip install 'flaketriage[s3]' moto[server])")
        if not args.no_s3:
            ok &= push_checks(work, scratch, stores[0], args.push_rounds or (2 if args.quick else 1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
