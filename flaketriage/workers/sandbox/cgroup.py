"""`Cgroup`: one replay's control groups, which limit its memory, processes and CPU as a whole.

A cgroup counts everything the run starts, however it forks or detaches, and the kernel enforces it:
over its memory limit the run is killed (exit 137) and the OOM counter says so; at its process limit
``fork`` fails (EAGAIN) and ``pids.events`` counts it. Both hierarchies are handled: cgroup v1 (a
group per controller, each under this process's own group of that controller) and cgroup v2 (one
group, under this process's own, when the controllers can be delegated to it). Where neither works
(no permission, no controller) `Cgroup.create` says what is missing and the caller falls back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Controller = Literal["memory", "pids", "cpu"]
PROC_MOUNTINFO = Path("/proc/self/mountinfo")
PROC_CGROUP = Path("/proc/self/cgroup")
EMPTY_WITHIN_S = 5.0
"""How long `Cgroup.close` keeps killing what is left in the group (a fork bomb outruns one pass)."""


@dataclass(frozen=True)
class Hierarchy:
    """A mounted cgroup hierarchy and where this process sits in it."""

    version: Literal[1, 2]
    mount: Path
    controllers: frozenset[str]
    own: Path
    """This process's own group: the directory new groups are made under."""


def hierarchies(mountinfo: Path = PROC_MOUNTINFO, membership: Path = PROC_CGROUP) -> list[Hierarchy]:
    """The cgroup hierarchies mounted here, from ``/proc/self/mountinfo`` and ``/proc/self/cgroup``."""
    try:
        mounts = mountinfo.read_text().splitlines()
        member = membership.read_text().splitlines()
    except OSError:
        return []
    own_v1: dict[str, str] = {}
    own_v2 = "/"
    for line in member:  # "ID:controller,controller:/path" (v2: "0::/path")
        number, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if number == "0" and not names:
            own_v2 = path
        for name in names.split(","):
            own_v1[name] = path
    found: list[Hierarchy] = []
    for line in mounts:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        fstype, options = after[0], after[2] if len(after) > 2 else ""
        root, mount = fields[3], Path(fields[4])
        if fstype == "cgroup":
            offered = frozenset(o for o in options.split(",") if o in ("memory", "pids", "cpu"))
            if not offered:
                continue
            own = own_v1.get(next(iter(offered)), "/")
            found.append(Hierarchy(1, mount, offered, _below(mount, root, own)))
        elif fstype == "cgroup2":
            try:
                offered = frozenset((mount / "cgroup.controllers").read_text().split())
            except OSError:
                continue
            found.append(Hierarchy(2, mount, offered, _below(mount, root, own_v2)))
    return found


def _below(mount: Path, root: str, own: str) -> Path:
    """The directory of group `own` in a hierarchy mounted at `mount` from its group `root`."""
    relative = os.path.relpath(own, root) if own.startswith(root) else "."
    return mount if relative == "." else mount / relative


@dataclass
class Cgroup:
    """A replay's groups: `join` in the child before it runs the command, `breach`, then `close`."""

    groups: dict[Controller, Path]
    missing: list[Controller] = field(default_factory=list)
    """Controllers asked for that no group could be made for (no hierarchy, no permission)."""
    _made: list[Path] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        *,
        memory_mb: int | None = None,
        pids: int | None = None,
        cpus: float | None = None,
        found: Iterable[Hierarchy] | None = None,
    ) -> Cgroup:
        """Groups that enforce the limits given (None: no limit), under this process's own groups."""
        wanted: dict[Controller, object] = {}
        if memory_mb is not None:
            wanted["memory"] = memory_mb
        if pids is not None:
            wanted["pids"] = pids
        if cpus is not None:
            wanted["cpu"] = cpus
        cgroup = cls(groups={})
        if not wanted:
            return cgroup
        name = f"flaketriage-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        chosen = _choose(list(found if found is not None else hierarchies()), list(wanted))
        for controller in wanted:
            hierarchy = chosen.get(controller)
            try:
                if hierarchy is None:
                    raise OSError("no hierarchy")
                group = cgroup._make(hierarchy, name)
                _limit(hierarchy.version, group, controller, wanted[controller])
                cgroup.groups[controller] = group
            except OSError:
                cgroup.missing.append(controller)
        return cgroup

    def _make(self, hierarchy: Hierarchy, name: str) -> Path:
        group = hierarchy.own / name
        if group in self._made:
            return group
        _sweep(hierarchy.own)
        if hierarchy.version == 2:  # v2 groups must be handed their controllers by the parent
            wanted = " ".join(f"+{c}" for c in sorted(hierarchy.controllers & {"memory", "pids", "cpu"}))
            (hierarchy.own / "cgroup.subtree_control").write_text(wanted)
        group.mkdir()
        self._made.append(group)
        return group

    def join(self) -> None:
        """Move the calling process into every group (its children then start inside them)."""
        pid = str(os.getpid())
        for group in dict.fromkeys(self.groups.values()):
            with open(group / "cgroup.procs", "w") as fh:
                fh.write(pid)

    def breach(self) -> Literal["memory", "pids"] | None:
        """The limit the run hit: ``pids`` when a fork was refused, ``memory`` when the kernel killed
        something for it; None otherwise. A fork bomb often hits both: its processes are the cause."""
        pids = self.groups.get("pids")
        if pids is not None and _counter(pids, ("pids.events",), "max") > 0:
            return "pids"
        memory = self.groups.get("memory")
        if memory is not None and _counter(memory, ("memory.events", "memory.oom_control"), "oom_kill") > 0:
            return "memory"
        return None

    def close(self) -> None:
        """Kill whatever is still in the groups and remove them."""
        deadline = time.monotonic() + EMPTY_WITHIN_S
        for group in reversed(self._made):
            while True:
                left = _members(group)
                if not left or time.monotonic() > deadline:
                    break
                for pid in left:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.005)
            while True:  # the last members may still be exiting
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline + EMPTY_WITHIN_S:
                        break  # left for the next run's sweep
                    time.sleep(0.005)
        self._made.clear()


def _choose(found: list[Hierarchy], wanted: list[Controller]) -> dict[Controller, Hierarchy]:
    """A hierarchy per controller: v1's own hierarchy for it, else v2 when it offers the controller."""
    chosen: dict[Controller, Hierarchy] = {}
    for controller in wanted:
        v1 = [h for h in found if h.version == 1 and controller in h.controllers]
        v2 = [h for h in found if h.version == 2 and controller in h.controllers]
        if v1 or v2:
            chosen[controller] = (v1 or v2)[0]
    return chosen


def _limit(version: int, group: Path, controller: Controller, value: object) -> None:
    if controller == "memory":
        limit = str(int(value) << 20)  # type: ignore[call-overload]
        if version == 1:
            (group / "memory.limit_in_bytes").write_text(limit)
            with contextlib.suppress(OSError):  # swap accounting is off on many kernels
                (group / "memory.memsw.limit_in_bytes").write_text(limit)
        else:
            (group / "memory.max").write_text(limit)
            with contextlib.suppress(OSError):
                (group / "memory.swap.max").write_text("0")
    elif controller == "pids":
        (group / "pids.max").write_text(str(value))
    else:
        period = 100_000
        quota = max(1000, int(float(value) * period))  # type: ignore[arg-type]
        if version == 1:
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (group / "cpu.max").write_text(f"{quota} {period}")


def _counter(group: Path, files: tuple[str, ...], key: str) -> int:
    """A ``key N`` line's N from the first of `files` that has it (0 when none does)."""
    for name in files:
        try:
            lines = (group / name).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            word, _, number = line.partition(" ")
            if word == key and number.strip().isdigit():
                return int(number)
    return 0


def _sweep(parent: Path) -> None:
    """Remove the empty groups of worker processes that are gone (killed before they could)."""
    try:
        entries = list(parent.glob("flaketriage-*-*"))
    except OSError:
        return
    for group in entries:
        owner = group.name.split("-")[1]
        if not owner.isdigit() or Path(f"/proc/{owner}").exists():
            continue
        with contextlib.suppress(OSError):
            group.rmdir()  # refused while anything is still in it


def _members(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []
