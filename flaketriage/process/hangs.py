"""Hangs: the Python stacks of a run that outlived its time limit, and the frames it was stuck in.

Before a run that passed its time limit is killed, the stacks of its Python process are dumped a
few times, `SAMPLE_GAP_S` apart: by ``py-spy dump`` when it is on PATH and may trace the process
(it needs ptrace permission: root, or ``CAP_SYS_PTRACE``), else by `faulthandler`, which the
injected ``sitecustomize`` registers on `HANG_SIGNAL` (SIGUSR1, written to stderr) when the run
has ``FLAKETRIAGE_HANG_DUMP=1``. The frames of the main thread that every dump shares are the
*stuck frames*: a loop that moves between helpers between two dumps is stuck in the function that
calls them, and a hang's fingerprint is built from them (`flaketriage.failure.fingerprint`).

The signal goes only to a process that both runs with ``FLAKETRIAGE_HANG_DUMP=1`` and catches it
(``SigCgt`` in ``/proc/PID/status``): a program whose own SIGUSR1 handler does something else
(Lightning checkpoints and requeues on it) and that never loaded our ``sitecustomize`` is left
alone. A program that replaced the handler after start-up gets its own handler run once, just
before it is killed anyway.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from flaketriage.process import reaper

HANG_SIGNAL = signal.SIGUSR1
"""What makes the injected ``sitecustomize`` dump every thread's stack (faulthandler) to stderr."""
HANG_DUMP_ENV = "FLAKETRIAGE_HANG_DUMP"
"""``1``: the injected ``sitecustomize`` registers the dump on `HANG_SIGNAL`."""
SAMPLES = 3
"""Dumps taken of a hung run: one dump cannot tell a stuck frame from one the loop passes through."""
SAMPLE_GAP_S = 0.2
DUMP_WAIT_S = 2.0
"""How long a faulthandler dump may take to reach stderr (it takes milliseconds)."""
PY_SPY_TIMEOUT_S = 10.0
MAX_CANDIDATES = 32
"""Processes of the run tried, topmost first, when looking for the Python one."""
STUCK_FRAMES = 8
"""Innermost stuck frames a hang's fingerprint keeps: where it hangs, not how the program started."""

Tool = Literal["py-spy", "faulthandler"]


def sitecustomize_dir() -> str:
    """The directory of the ``sitecustomize`` replays (and captures with a time limit) run with."""
    return str(Path(__file__).parents[1] / "workers" / "sitecustomize")


# --- reading dumps --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackFrame:
    filename: str
    function: str
    """As the dump names it: faulthandler prints the code name (``run``), py-spy the qualified
    name (``Thread.run``); `frame_function` reads both the same way."""
    lineno: int | None


@dataclass(frozen=True)
class ThreadStack:
    ident: str
    name: str | None
    main: bool
    frames: tuple[StackFrame, ...]
    """Innermost first, as both tools print them."""


_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):\s*$")
_FH_STACK = re.compile(r"^Stack \(most recent call first\):\s*$")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<func>.+?)\s*$')
_SPY_PROCESS = re.compile(r"^Process (?P<pid>\d+): ")
_SPY_THREAD = re.compile(r'^Thread (?P<id>0x[0-9A-Fa-f]+|\d+) \((?P<state>[^)]*)\)(?:: "(?P<name>.*)")?\s*$')
_SPY_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>.+?):(?P<line>\d+)\)\s*$")


def frame_function(function: str) -> str:
    """The function's own name: ``Thread.run`` and ``f.<locals>.g`` become ``run`` and ``g``."""
    return function.rsplit(".", 1)[-1] if not function.startswith("<") else function


def parse_dump(text: str) -> list[ThreadStack]:
    """The threads of one dump, by faulthandler or ``py-spy dump``, with the main thread marked.

    faulthandler lists the newest thread first, so the main thread is the last one; py-spy names
    it ``MainThread`` (else its id is the process id). Lines of neither shape are skipped.
    """
    lines = text.splitlines()
    if any(_SPY_THREAD.match(line) for line in lines):
        return _parse_py_spy(lines)
    return _parse_faulthandler(lines)


def _parse_faulthandler(lines: list[str]) -> list[ThreadStack]:
    threads: list[tuple[str, list[StackFrame]]] = []
    for line in lines:
        header = _FH_THREAD.match(line)
        if header or _FH_STACK.match(line):
            threads.append((header.group(1) if header else "main", []))
            continue
        frame = _FH_FRAME.match(line)
        if frame and threads:
            lineno = frame.group("line")
            threads[-1][1].append(
                StackFrame(
                    frame.group("file"), frame.group("func"), int(lineno) if lineno.isdigit() else None
                )
            )
    return [
        ThreadStack(ident=ident, name=None, main=i == len(threads) - 1, frames=tuple(frames))
        for i, (ident, frames) in enumerate(threads)
    ]


def _parse_py_spy(lines: list[str]) -> list[ThreadStack]:
    pid = None
    threads: list[tuple[str, str | None, list[StackFrame]]] = []
    for line in lines:
        process = _SPY_PROCESS.match(line)
        if process:
            pid = process.group("pid")
            continue
        header = _SPY_THREAD.match(line)
        if header:
            threads.append((header.group("id"), header.group("name"), []))
            continue
        frame = _SPY_FRAME.match(line)
        if frame and threads:
            threads[-1][2].append(
                StackFrame(frame.group("file"), frame.group("func"), int(frame.group("line")))
            )
    main = next((i for i, t in enumerate(threads) if t[1] == "MainThread"), None)
    if main is None:
        main = next((i for i, t in enumerate(threads) if t[0] == pid), 0)
    return [
        ThreadStack(ident=ident, name=name, main=i == main, frames=tuple(frames))
        for i, (ident, name, frames) in enumerate(threads)
    ]


@dataclass(frozen=True)
class HangDump:
    """The dumps of one hung run: raw text per dump, and what they say about the main thread."""

    tool: Tool
    samples: tuple[str, ...]

    def main_stacks(self) -> list[tuple[StackFrame, ...]]:
        """The main thread's stack in each dump that has one (innermost first)."""
        stacks = []
        for sample in self.samples:
            main = next((t for t in parse_dump(sample) if t.main), None)
            if main is not None and main.frames:
                stacks.append(main.frames)
        return stacks

    def stuck(self) -> tuple[StackFrame, ...]:
        """The main thread's frames present in every dump (innermost first, as in the last dump).

        Stacks are compared from the outermost frame by file and function (not line: a loop moves
        between lines), and the longest common part is where the run is stuck.
        """
        stacks = self.main_stacks()
        if not stacks:
            return ()
        outer_first = [list(reversed(s)) for s in stacks]
        common = 0
        for frames in zip(*outer_first, strict=False):
            if len({(f.filename, frame_function(f.function)) for f in frames}) != 1:
                break
            common += 1
        return tuple(reversed(outer_first[-1][:common]))

    def text(self) -> str:
        """The evidence: which tool, how many dumps, and the last dump whole."""
        last = next((s for s in reversed(self.samples) if s.strip()), "")
        head = (
            f"Python stacks of the run when it passed its time limit ({self.tool}, the last of "
            f"{len(self.samples)} dumps {SAMPLE_GAP_S:g} s apart):"
        )
        return f"{head}\n\n{last.strip()}\n"

    def where(self) -> str:
        """The stuck frames as a readable stack, outermost first (``file:line in function``)."""
        return "\n".join(
            f"{f.filename}:{f.lineno if f.lineno is not None else '?'} in {frame_function(f.function)}"
            for f in reversed(self.stuck())
        )


# --- taking dumps ---------------------------------------------------------------------------------


def dump_hung(
    root: int,
    stderr_size: Callable[[], int],
    stderr_tail: Callable[[int], bytes],
    *,
    samples: int = SAMPLES,
    gap_s: float = SAMPLE_GAP_S,
    below_only: bool = False,
) -> HangDump | None:
    """Dump the stacks of the topmost Python process at or below `root` (only below, with
    `below_only`: `root` is a wrapper of ours), `samples` times.

    py-spy first (found on this process's PATH), then faulthandler through `HANG_SIGNAL`, whose
    output arrives on the run's stderr: `stderr_size` and `stderr_tail` read what the run wrote
    so far. None when neither could dump anything (not a Python program, or one that never loaded
    the ``sitecustomize`` and cannot be traced).
    """
    below = reaper.descendants(root)
    candidates = _topmost_first(below if below_only else [root, *below])[:MAX_CANDIDATES]
    py_spy = shutil.which("py-spy")
    if py_spy is not None:
        found = _py_spy_dumps(py_spy, candidates, samples, gap_s)
        if found is not None:
            return found
    target = next((pid for pid in candidates if _takes_dump_signal(pid)), None)
    if target is None:
        return None
    return dump_by_signal(lambda: os.kill(target, HANG_SIGNAL), stderr_size, stderr_tail, samples, gap_s)


def dump_by_signal(
    send: Callable[[], object],
    stderr_size: Callable[[], int],
    stderr_tail: Callable[[int], bytes],
    samples: int = SAMPLES,
    gap_s: float = SAMPLE_GAP_S,
) -> HangDump | None:
    """Faulthandler dumps of a run whose `HANG_SIGNAL` `send` delivers (``os.kill``, or a container
    engine's kill with ``signal="SIGUSR1"``), read from its stderr as it grows; None when no dump came
    (the run never registered the handler, or it died)."""
    texts: list[str] = []
    for i in range(samples):
        if i:
            time.sleep(gap_s)
        text = _signal_dump(send, stderr_size, stderr_tail)
        if not text:
            break  # it died, or the handler is gone
        texts.append(text)
    found = HangDump("faulthandler", tuple(texts))
    return found if found.main_stacks() else None


def _py_spy_dumps(py_spy: str, candidates: Sequence[int], samples: int, gap_s: float) -> HangDump | None:
    for pid in candidates:
        first = _py_spy(py_spy, pid)
        if first is None:
            continue
        texts = [first]
        for _ in range(samples - 1):
            time.sleep(gap_s)
            more = _py_spy(py_spy, pid)
            if more is None:
                break
            texts.append(more)
        found = HangDump("py-spy", tuple(texts))
        if found.main_stacks():
            return found
    return None


def _py_spy(py_spy: str, pid: int) -> str | None:
    """One ``py-spy dump``, or None when py-spy cannot read this process (not Python, no ptrace)."""
    try:
        done = subprocess.run(
            [py_spy, "dump", "--pid", str(pid), "--full-filenames"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=PY_SPY_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 and "Thread " in done.stdout else None


def _signal_dump(
    send: Callable[[], object], stderr_size: Callable[[], int], stderr_tail: Callable[[int], bytes]
) -> str:
    before = stderr_size()
    try:
        send()
    except Exception:  # gone (OSError), or the engine refused (its own errors)
        return ""
    deadline = time.monotonic() + DUMP_WAIT_S
    last, quiet_since = before, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        size = stderr_size()
        if size != last:
            last, quiet_since = size, time.monotonic()
        elif size > before and time.monotonic() - quiet_since >= 0.1:
            break  # the dump is written whole in one handler call; 100 ms of quiet ends it
    grown = stderr_size() - before
    return stderr_tail(grown).decode("utf-8", "replace") if grown > 0 else ""


def _takes_dump_signal(pid: int) -> bool:
    """Whether `pid` loaded the dump handler: it runs with the variable set and catches the signal."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read().split(b"\0")
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            status = fh.read()
    except OSError:
        return False
    if f"{HANG_DUMP_ENV}=1".encode() not in environ:
        return False
    caught = re.search(r"^SigCgt:\s*([0-9a-fA-F]+)", status, re.MULTILINE)
    return caught is not None and bool((int(caught.group(1), 16) >> (HANG_SIGNAL - 1)) & 1)


def _topmost_first(pids: Sequence[int]) -> list[int]:
    """`pids` ordered by depth in their process tree (a parent before its children), then by pid."""
    parents: dict[int, int] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
            parents[pid] = int(stat[stat.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone already

    def depth(pid: int) -> int:
        seen = 0
        while pid in parents and seen < len(parents):
            pid, seen = parents[pid], seen + 1
        return seen

    return sorted(parents, key=lambda pid: (depth(pid), pid))
