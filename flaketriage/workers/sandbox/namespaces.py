"""Namespaces for the process sandbox: no network, and nothing writable but the workspace.

Where bubblewrap is not installed, a replay can still be kept off the network and from writing
outside its workspace when this process may make namespaces (root, or an unprivileged user
namespace mapped to itself): in the child, before it runs the command, a network namespace of its
own (nothing but a loopback that is down) and a mount namespace where every mount is read-only
except the workspace, a private /tmp and a private /dev/shm. /proc and /dev stay as they are. The
mount namespace needs the paths the run reads under /tmp (an interpreter installed there) bound
back in, as bubblewrap does.

Everything the child needs is prepared in the parent (the C library loaded, the mount table read,
paths encoded), so the child only makes system calls. Whether the namespaces can be made is tried
once per process on a child that does nothing else (`Namespaces.usable`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}
KEPT_WRITABLE = (Path("/proc"), Path("/dev"))
"""Mounts left as they are: the process's own view of itself and the device nodes (/dev/null)."""
PRIVATE_TMP = Path("/tmp")
PRIVATE_SHM = Path("/dev/shm")


@dataclass(frozen=True)
class Mount:
    point: Path
    flags: int
    """The mount's own flags (nosuid, nodev, noexec, atime), kept when it is made read-only."""


def mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[Mount]:
    """This process's mounts, in the order they were made."""
    found: list[Mount] = []
    for line in mountinfo.read_text().splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        point = Path(_unescape(fields[4]))
        flags = 0
        for option in fields[5].split(","):
            flags |= _FLAGS.get(option, 0)
        found.append(Mount(point, flags))
    return found


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash in a path as octal escapes (``\\040``)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1 : i + 4].isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _within(path: Path, root: Path) -> bool:
    """Whether `path` is `root` or lies under it (both resolved: a link may lead in or out)."""
    path, root = path.resolve(), root.resolve()
    return path == root or root in path.parents


def _kept(point: Path) -> bool:
    return any(point == k or k in point.parents for k in KEPT_WRITABLE) and point != PRIVATE_SHM


@dataclass
class Namespaces:
    """What the process sandbox can make here, and the child's side of making it."""

    network: bool
    files: bool
    _libc: ctypes.CDLL = field(default_factory=lambda: ctypes.CDLL(None, use_errno=True), repr=False)

    def preexec(self, workspace: Path, cwd: Path, readable: Sequence[Path]) -> Callable[[], None]:
        """The child's part: leave the network and make every mount read-only but the workspace.

        `readable`: paths under /tmp the run must still read (its interpreter); bound back read-only.
        """
        libc = self._libc
        uid, gid = os.getuid(), os.getgid()
        flags = (CLONE_NEWNET if self.network else 0) | (CLONE_NEWNS if self.files else 0)
        if uid != 0:
            flags |= CLONE_NEWUSER
        table = [m for m in mounts() if not _kept(m.point)] if self.files else []
        workspace_b, cwd_b = os.fsencode(workspace), os.fsencode(cwd)
        # A readable path in the workspace (a local project's import root on PYTHONPATH: the
        # workspace itself) is seen through the workspace's own writable bind: bound read-only
        # over it, it would make the workspace read-only to the run.
        under_tmp = [
            os.fsencode(p)
            for p in readable
            if PRIVATE_TMP in p.parents and p.exists() and not _within(p, workspace)
        ]
        points = [(os.fsencode(m.point), m.flags) for m in table]

        def check(result: int, what: str) -> None:
            if result != 0:
                number = ctypes.get_errno()
                raise OSError(number, f"{what}: {os.strerror(number)}")

        def mount(
            source: bytes | None, target: bytes, fstype: bytes | None, mflags: int, data: bytes | None
        ) -> int:
            return int(libc.mount(source, target, fstype, ctypes.c_ulong(mflags), data))

        def apply() -> None:
            check(libc.unshare(flags), "unshare")
            if uid != 0:
                _map_self(uid, gid)
            if not self.files:
                return
            check(mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
            # Held open across the private /tmp, which may cover them, and bound back from there.
            # The workspace is bound last, so that no read-only path above it covers it.
            held = [(os.open(p, os.O_PATH), p, True) for p in under_tmp]
            held += [(os.open(workspace_b, os.O_PATH | os.O_DIRECTORY), workspace_b, False)]
            for point, mflags in points:
                failed = mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | mflags, None) != 0
                if failed and ctypes.get_errno() not in (errno.ENOENT, errno.EINVAL):  # gone, or covered
                    check(-1, f"making {os.fsdecode(point)} read-only")
            check(mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=1777"), "a private /tmp")
            if os.path.isdir(b"/dev/shm"):
                check(
                    mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=1777"),
                    "a private /dev/shm",
                )
            for fd, path, read_only in held:
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.makedirs(path, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    if not os.path.exists(path):
                        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
                source = f"/proc/self/fd/{fd}".encode()
                check(mount(source, path, None, MS_BIND | MS_REC, None), f"binding {os.fsdecode(path)}")
                # A bind takes its source mount's flags, read-only by now: the workspace is made writable.
                access = MS_RDONLY if read_only else 0
                check(mount(None, path, None, MS_BIND | MS_REMOUNT | access, None), f"remounting {path!r}")
                os.close(fd)
            os.chdir(cwd_b)  # the old working directory lies on the read-only mount

        return apply

    def usable(self) -> bool:
        """Whether a child can be given these namespaces here (tried once per process)."""
        key = (self.network, self.files)
        with _probe_lock:
            if key not in _probes:
                _probes[key] = self._probe()
            return _probes[key]

    def _probe(self) -> bool:
        # The probe runs this interpreter, bound back like a replay's when it lives under /tmp (a
        # checkout or virtualenv there): hidden by the private /tmp, it could not start at all.
        try:
            with tempfile.TemporaryDirectory(prefix="flaketriage-ns-probe-") as scratch:
                done = subprocess.run(
                    [sys.executable, "-S", "-c", "open('probe', 'w').write('ok')"],
                    cwd=scratch,
                    preexec_fn=self.preexec(Path(scratch), Path(scratch), (interpreter_environment(),)),
                    capture_output=True,
                    check=False,
                    timeout=30,
                )
                return done.returncode == 0 and Path(scratch, "probe").read_text() == "ok"
        except (OSError, subprocess.SubprocessError):
            return False


def interpreter_environment() -> Path:
    """This interpreter's environment (a virtualenv's root when it sits in ``bin/``): what a child
    running it must still read when a private /tmp covers it."""
    exe = Path(sys.executable)
    return exe.parent.parent if exe.parent.name == "bin" else exe.parent


_probes: dict[tuple[bool, bool], bool] = {}
_probe_lock = threading.Lock()


def _map_self(uid: int, gid: int) -> None:
    """In a new user namespace, be the same user as outside (an unprivileged process may map itself)."""
    with open("/proc/self/setgroups", "w") as fh:
        fh.write("deny")
    with open("/proc/self/uid_map", "w") as fh:
        fh.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as fh:
        fh.write(f"{gid} {gid} 1")
