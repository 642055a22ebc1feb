"""The README's first command: `flaketriage demo` has the embedded service (the receiver, a worker
and beat on SQLite and the local broker) triage its project's two failures, prints the dashboard's
URL, and then exits (no terminal, or ``--no-serve``) or serves until Ctrl-C (a terminal). However it
ends (done, Ctrl-C, SIGTERM, a service process that died), nothing it started is left running."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from flaketriage.process.reaper import descendants
from flaketriage.records import Case, Database, QuarantineRow

pytestmark = pytest.mark.slow
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
DEMO_TIMEOUT_S = 240.0


class Demo:
    """`flaketriage demo ARGS` running in a subprocess, its output (stdout and stderr) collected as it
    comes; in a pseudo-terminal of its own (its controlling terminal, so a typed Ctrl-C reaches it as
    it reaches a person's demo), or with pipes, as CI runs it."""

    def __init__(self, tmp: Path, *args: str, terminal: bool) -> None:
        self.tmp = tmp
        self.text = ""
        self._lock = threading.Lock()
        self.master: int | None = None
        env = {**os.environ, "TMPDIR": str(tmp), "COLUMNS": "200"}  # the project lands under tmp
        argv = [sys.executable, "-m", "flaketriage", "demo", *args]
        if terminal:
            self.master, slave = os.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
            self.proc = subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=tmp, preexec_fn=_own_terminal
            )
            os.close(slave)
            source = self.master
        else:
            self.proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp,
                start_new_session=True,
            )
            assert self.proc.stdout is not None
            source = self.proc.stdout.fileno()
        self._reader = threading.Thread(target=self._read, args=(source,), daemon=True)
        self._reader.start()
        self.started: dict[int, tuple[int, str]] = {}
        """Every process found under the demo while it ran: pid -> (start time, command line)."""

    def _read(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the terminal's other end closed (EIO)
                return
            if not chunk:
                return
            with self._lock:
                self.text += ANSI.sub("", chunk.decode(errors="replace").replace("\r\n", "\n"))

    def output(self) -> str:
        with self._lock:
            return self.text

    def wait_for(self, pattern: str, timeout: float = DEMO_TIMEOUT_S) -> re.Match[str]:
        """The first match of `pattern` in the output, noting the processes under the demo meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.note_processes()
            found = re.search(pattern, self.output())
            if found:
                return found
            assert self.proc.poll() is None, f"the demo ended ({self.proc.returncode}):\n{self.output()}"
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} after {timeout} s:\n{self.output()}")

    def note_processes(self) -> None:
        for pid in descendants(self.proc.pid):
            if pid not in self.started and (seen := _process(pid)) is not None:
                self.started[pid] = seen

    def type(self, text: str) -> None:
        assert self.master is not None
        os.write(self.master, text.encode())

    def finish(self, timeout: float = DEMO_TIMEOUT_S) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:  # the test failed: leave nothing behind either
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._reader.join(timeout=10)
        if self.master is not None:
            os.close(self.master)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code

    @property
    def root(self) -> Path:
        found = re.search(r"demo project (\S+)", self.output())
        assert found, self.output()
        return Path(found.group(1))

    def assert_nothing_left(self) -> None:
        """No process the demo started lives on (same pid and start time), and none works in its
        project (a process that left the demo's tree would still be there)."""
        time.sleep(0.5)  # a process killed a moment ago is gone from /proc by now
        alive = [cmd for pid, (start, cmd) in self.started.items() if _start_of(pid) == start]
        assert not alive, f"left running after the demo: {alive}"
        assert self.started, "the demo's processes were never seen"  # the check saw something
        in_project = _processes_under(self.root)
        assert not in_project, f"left running in the demo project: {in_project}"


def _own_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _process(pid: int) -> tuple[int, str] | None:
    start = _start_of(pid)
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return (start, cmd.strip()) if start is not None else None


def _start_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return None if fields[0] == b"Z" else int(fields[19])  # a zombie has ended


def _processes_under(root: Path) -> list[str]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{name}/cwd")
        except OSError:
            continue
        if cwd == str(root) or cwd.startswith(f"{root}/"):
            found.append(f"{name} {_process(int(name))}")
    return found


@pytest.fixture
def cleanup() -> Iterator[list[Demo]]:
    demos: list[Demo] = []
    yield demos
    for demo in demos:
        if demo.proc.poll() is None:
            os.killpg(demo.proc.pid, signal.SIGKILL)
            demo.proc.wait()


def test_without_a_terminal_the_service_triages_both_failures_and_the_demo_exits(
    tmp_path: Path, cleanup: list[Demo]
) -> None:
    demo = Demo(tmp_path, terminal=False)  # no --no-serve: CI and scripts need no flag to end
    cleanup.append(demo)
    demo.wait_for(r"5\. the service triages")
    assert demo.finish() == 0, demo.output()
    out = demo.output()
    port = re.search(r"dashboard: http://127\.0\.0\.1:(\d+)/dashboard\n", out)
    assert port, out
    assert re.search(r"verdict deterministic after \d+ replays", out)
    assert "minimized data/train.csv: kept 1 of 400 rows" in out
    assert re.search(r"verdict flaky after \d+ replays", out)
    assert "the service stops now" in out and "Traceback" not in out
    # The cases came out of the service's records, reported through the pipeline.
    store = demo.root / ".flaketriage"
    database = Database(f"sqlite:///{store / 'service.db'}")
    with database.session() as session:
        cases = {
            c.verdict: {"id": c.id, "status": c.status, "kind": c.report_kind, "url": c.report_url}
            for c in session.scalars(select(Case))
        }
        quarantined = [row.entry for row in session.scalars(select(QuarantineRow))]
    database.dispose()
    assert set(cases) == {"deterministic", "flaky"}, cases
    assert {c["status"] for c in cases.values()} == {"reported"}
    for verdict, case in cases.items():
        assert (
            f"case {case['id']} ({verdict}): http://127.0.0.1:{port.group(1)}/dashboard/cases/{case['id']}"
            in out
        )
    issue = Path(str(cases["deterministic"]["url"]))
    assert f"markdown: {issue}" in out
    assert issue.parent == store / "issues" and "FloatingPointError" in issue.read_text()
    assert len(quarantined) == 1 and "test_flaky.py" in json.dumps(quarantined)
    assert cases["flaky"]["kind"] == "quarantine"
    # The service's processes wrote their logs, and stopped.
    assert {p.name for p in (store / "logs").iterdir()} == {"receiver.log", "worker.log", "beat.log"}
    assert "Application shutdown complete" in (store / "logs" / "receiver.log").read_text()
    demo.assert_nothing_left()


def test_in_a_terminal_it_serves_the_dashboard_until_ctrl_c(tmp_path: Path, cleanup: list[Demo]) -> None:
    demo = Demo(tmp_path, terminal=True)
    cleanup.append(demo)
    url = demo.wait_for(r"serving (http://127\.0\.0\.1:\d+)/dashboard until Ctrl-C").group(1)
    case_url = re.search(r"case (\d+) \(flaky\): (\S+)", demo.output())
    assert case_url, demo.output()
    overview = httpx.get(f"{url}/dashboard", timeout=10)
    assert overview.status_code == 200 and overview.headers["content-type"].startswith("text/html")
    assert "<html" in overview.text and "</html>" in overview.text
    case = httpx.get(case_url.group(2), timeout=10)
    assert case.status_code == 200 and "flaky" in case.text
    quarantine = httpx.get(f"{url}/v1/quarantine", timeout=10).json()
    assert "test_flaky.py" in json.dumps(quarantine)
    time.sleep(1)
    assert demo.proc.poll() is None  # still serving
    demo.note_processes()
    demo.type("\x03")  # Ctrl-C, typed: the terminal sends SIGINT to its foreground group
    assert demo.finish(timeout=60) == 0, demo.output()
    out = demo.output()
    assert "the service stopped" in out and "Traceback" not in out, out
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/dashboard", timeout=2)
    demo.assert_nothing_left()


def test_in_a_terminal_no_serve_exits_after_printing(tmp_path: Path, cleanup: list[Demo]) -> None:
    demo = Demo(tmp_path, "--no-serve", "--no-keep", terminal=True)
    cleanup.append(demo)
    demo.wait_for(r"5\. the service triages")
    assert demo.finish() == 0, demo.output()
    out = demo.output()
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/dashboard", out)
    assert "serving" not in out and "the service stops now" in out
    assert not demo.root.exists()  # --no-keep
    demo.assert_nothing_left()


def test_a_service_process_that_dies_stops_the_demo_with_one_clear_error(
    tmp_path: Path, cleanup: list[Demo]
) -> None:
    demo = Demo(tmp_path, terminal=False)
    cleanup.append(demo)
    demo.wait_for(r"3\. capture the flaky test")
    worker = None
    deadline = time.monotonic() + 60
    while worker is None and time.monotonic() < deadline:
        demo.note_processes()
        worker = next((p for p, (_, cmd) in demo.started.items() if cmd.endswith("--concurrency 2")), None)
        time.sleep(0.1)
    assert worker is not None, demo.started
    demo.wait_for(r"4\. send")
    os.kill(worker, signal.SIGKILL)  # what the OOM killer does
    assert demo.finish() == 2, demo.output()
    out = demo.output()
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out
    assert "the service's worker was killed by SIGKILL" in errors[0]
    assert str(demo.root / ".flaketriage" / "logs" / "worker.log") in errors[0]
    assert "Traceback" not in out
    demo.assert_nothing_left()


def test_sigterm_during_the_triage_stops_everything_cleanly(tmp_path: Path, cleanup: list[Demo]) -> None:
    demo = Demo(tmp_path, terminal=False)
    cleanup.append(demo)
    demo.wait_for(r"5\. the service triages")
    demo.note_processes()
    demo.proc.send_signal(signal.SIGTERM)  # CI cancelling the job
    assert demo.finish(timeout=60) == 128 + signal.SIGTERM, demo.output()
    out = demo.output()
    assert "stopped by SIGTERM" in out and "Traceback" not in out, out
    demo.assert_nothing_left()


def test_a_port_in_use_is_a_clear_error(tmp_path: Path, cleanup: list[Demo]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        demo = Demo(tmp_path, "--port", str(port), terminal=False)
        cleanup.append(demo)
        assert demo.finish(timeout=60) == 2, demo.output()
    out = demo.output()
    assert f"error: port {port} on 127.0.0.1 is taken by another program: pass another --port" in out, out
    assert "Traceback" not in out
