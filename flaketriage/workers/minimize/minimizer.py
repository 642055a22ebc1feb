"""Minimization: the smallest data and integer knobs with which the failure still reproduces.

Each declared data input is reduced to a 1-minimal subset by the `SubsetReducer`, then integer
command-line knobs (``--steps 1000``) are lowered. A candidate fails on its first reproduction and
passes only after enough clean replays for the measured failure rate, so flakiness never makes a
needed item look removable. The result is an ordinary bundle whose ``parent`` is the original.

What a user pays is every run, so none is spent twice: the verdict's replays are the original's
evidence (it is not replayed again), a failure that reproduced every time is searched with single
runs and checked only where a miss could have left an unneeded item (`NoisyOracle.trusted`), and
the minimal bundle is replayed once more only when no run reproduced exactly it already. A
deterministic failure then costs the reducer's calls plus two runs per culprit after the first:
15, 32 and 66 runs for one, two and four culprits among 10,000 rows (``bench/minimize.py``).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flaketriage.bundle.files import store_data_input
from flaketriage.bundle.io import write_bundle
from flaketriage.bundle.manifest import BlobRef, Command, DataInput, Minimization
from flaketriage.errors import MinimizeError
from flaketriage.store import Store
from flaketriage.workers.minimize.noisy_oracle import DEFAULT_ERROR, NoisyOracle
from flaketriage.workers.minimize.reducer import SubsetReducer, minimize_integer
from flaketriage.workers.replay import Replayer, ReplayResult, Variant
from flaketriage.workers.verdict import Outcome

_INT = re.compile(r"^\d+$")
_KNOB_EXCLUDED = re.compile(r"seed|port|rank|device|gpu|world|worker|shard|id$", re.IGNORECASE)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Knob:
    """An integer command-line option: where its value sits in argv."""

    flag: str
    index: int
    value: int
    inline: bool
    """``--steps=1000`` (True) rather than ``--steps 1000``."""

    def apply(self, argv: Sequence[str], value: int) -> list[str]:
        out = list(argv)
        out[self.index] = f"{self.flag}={value}" if self.inline else str(value)
        return out


def find_knobs(argv: Sequence[str]) -> list[Knob]:
    """Integer options worth lowering: ``--name N`` / ``--name=N`` with N ≥ 2, not seeds or ports."""
    knobs: list[Knob] = []
    for i, arg in enumerate(argv):
        if not arg.startswith("-"):
            continue
        flag, sep, inline_value = arg.partition("=")
        if sep:
            value, index, inline = inline_value, i, True
        elif i + 1 < len(argv):
            value, index, inline = argv[i + 1], i + 1, False
        else:
            continue
        if _INT.match(value) and int(value) >= 2 and not _KNOB_EXCLUDED.search(flag.lstrip("-")):
            knobs.append(Knob(flag=flag, index=index, value=int(value), inline=inline))
    return knobs


@dataclass
class MinimizeResult:
    """The minimal bundle (in the store, by id) and how it was reached."""

    bundle_id: str
    data: dict[str, tuple[int, int]] = field(default_factory=dict)
    """data path → (items kept, items before)."""
    args: dict[str, tuple[str, str]] = field(default_factory=dict)
    """option → (value before, value after)."""
    oracle_calls: int = 0
    replays: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON object that `from_json` turns back into an equal result."""
        return {
            "bundle": self.bundle_id,
            "data": {p: {"kept": k, "of": n} for p, (k, n) in self.data.items()},
            "args": {a: {"from": f, "to": t} for a, (f, t) in self.args.items()},
            "oracle_calls": self.oracle_calls,
            "replays": self.replays,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MinimizeResult:
        """The result `to_json` wrote."""
        return cls(
            bundle_id=data["bundle"],
            data={p: (v["kept"], v["of"]) for p, v in data["data"].items()},
            args={a: (v["from"], v["to"]) for a, v in data["args"].items()},
            oracle_calls=data["oracle_calls"],
            replays=data["replays"],
        )


class BundleMinimizer:
    """Reduces one bundle through a `Replayer`, given the verdict's evidence: `reproductions` of
    `trials` replays that either reproduced or passed (a replay that failed differently counts in
    neither). How many clean runs make a candidate pass comes from that evidence's rate interval
    (`NoisyOracle`), never from a point estimate: the search asks cheaply, the answer is
    confirmed carefully; a failure that reproduced every time is trusted until a check catches
    a miss."""

    def __init__(
        self,
        store: Store,
        replayer: Replayer,
        bundle_id: str,
        reproductions: int,
        trials: int,
        progress: Progress | None = None,
        error: float = DEFAULT_ERROR,
    ) -> None:
        self.store = store
        self.replayer = replayer
        self.manifest = replayer.manifest
        self.bundle_id = bundle_id
        self.noise = NoisyOracle(reproductions, trials, error=error)
        self.progress = progress or (lambda _msg: None)
        self.oracle_calls = 0
        self.replays = 0
        self.last_failure: ReplayResult | None = None
        self._last_reproduced: Variant | None = None

    def _run(self, variant: Variant | None) -> bool:
        self.replays += 1
        result = self.replayer.run(variant)
        if result.outcome is Outcome.REPRODUCED:
            self.last_failure = result
            self._last_reproduced = variant
            return True
        return False

    def _reproduced_last(self, variant: Variant) -> bool:
        """Whether the latest run that reproduced was of exactly `variant`."""
        last = self._last_reproduced
        if last is None or last.data is None or variant.data is None:
            return False
        same_data = {p: list(v) for p, v in last.data.items()} == {
            p: list(v) for p, v in variant.data.items()
        }
        return same_data and list(last.argv or ()) == list(variant.argv or ())

    def fails(self, variant: Variant) -> bool:
        """A search question: True when the variant reproduced (proof); False after the few clean
        runs a search question gets (a mistake costs work, not the answer: see `confirms`)."""
        self.oracle_calls += 1
        return self.noise.fails(lambda: self._run(variant), self.noise.search_runs)

    def confirms(self, variant: Variant, items: int) -> bool:
        """A confirmation question about a final answer of `items` items: True when the variant
        reproduced; False only after enough clean runs that a miss is rare."""
        self.oracle_calls += 1
        return self.noise.fails(lambda: self._run(variant), self.noise.confirm_runs(items))

    def rechecks(self, variant: Variant, items: int) -> bool:
        """`confirms` for a candidate the search saw (or inferred) pass: one that reproduces while
        the failure is trusted proves the search's pass a miss, and the failure flaky."""
        trusted = self.noise.trusted
        fails = self.confirms(variant, items)
        if fails and trusted:
            self.noise.missed()
        return fails

    def run(self) -> MinimizeResult:
        subsets: dict[str, list[int]] = {
            d.path: list(range(d.items)) for d in self.manifest.data if d.reducible
        }
        argv = list(self.manifest.command.argv)
        for data in self.manifest.data:
            if not data.reducible or data.items <= 1:
                continue
            self.progress(f"reducing {data.path} ({data.items} items)")

            def predicate(kept: Sequence[int], path: str = data.path) -> bool:
                return self.fails(Variant(data={**subsets, path: list(kept)}, argv=argv))

            def confirm(kept: Sequence[int], path: str = data.path) -> bool:
                return self.rechecks(Variant(data={**subsets, path: list(kept)}, argv=argv), len(kept) + 1)

            trusted = self.noise.trusted
            kept = SubsetReducer(predicate, confirm_with=confirm, trust_passes=trusted).reduce(
                subsets[data.path]
            )
            if trusted and not self.noise.trusted:
                # A check caught a miss: the search's single runs may have kept more items than
                # the failure needs. The answer fails (it reproduced), so it holds every culprit:
                # search it again, now with the runs a flaky failure's questions get.
                self.progress(f"the failure is flaky after all: reducing {data.path} again")
                kept = SubsetReducer(predicate, confirm_with=confirm).reduce(kept)
            subsets[data.path] = list(kept)
        args: dict[str, tuple[str, str]] = {}
        for knob in find_knobs(argv):
            self.progress(f"lowering {knob.flag} from {knob.value}")

            def knob_fails(value: int, knob: Knob = knob, base: list[str] = argv) -> bool:
                return self.fails(Variant(data=subsets, argv=knob.apply(base, value)))

            best, _calls = minimize_integer(knob.value, knob_fails)
            # A search mistake leaves the value too high, never too low: confirm one below it.
            while best > 1 and self.rechecks(Variant(data=subsets, argv=knob.apply(argv, best - 1)), 1):
                best, _calls = minimize_integer(best - 1, knob_fails)
            if best < knob.value:
                args[knob.flag] = (str(knob.value), str(best))
                argv = knob.apply(argv, best)
        minimal = Variant(data=subsets, argv=argv)
        # The search's last reproduction is usually of the answer itself: proof enough.
        if not self._reproduced_last(minimal):
            self.progress("confirming the minimal reproduction")
            if not self.confirms(minimal, 1):
                raise MinimizeError(
                    "the minimized bundle no longer reproduces the failure; the failure depends on "
                    "more than the declared data and arguments (keep the original bundle)"
                )
        return self._write(subsets, argv, args)

    def _write(
        self, subsets: dict[str, list[int]], argv: list[str], args: dict[str, tuple[str, str]]
    ) -> MinimizeResult:
        from flaketriage.bundle.datasets import write_subset

        data_inputs: list[DataInput] = []
        kept: dict[str, tuple[int, int]] = {}
        with tempfile.TemporaryDirectory(
            prefix="flaketriage-min-", dir=self.replayer.context.temp_root
        ) as tmp:
            for data in self.manifest.data:
                if data.path not in subsets:
                    data_inputs.append(data)
                    continue
                reduced = Path(tmp) / f"{len(data_inputs)}" / Path(data.path).name
                reduced.parent.mkdir(parents=True)
                write_subset(self.replayer.template.cwd / data.path, reduced, data.format, subsets[data.path])
                data_inputs.append(store_data_input(self.store, reduced, data.path))
                kept[data.path] = (len(subsets[data.path]), data.items)
        logs = dict(self.manifest.logs)
        if self.last_failure is not None:
            logs["stdout"] = self._put_text(self.last_failure.process.stdout)
            logs["stderr"] = self._put_text(self.last_failure.process.stderr)
        command = Command(
            argv=tuple(argv),
            cwd=self.manifest.command.cwd,
            env=self.manifest.command.env,
            timeout_s=self.manifest.command.timeout_s,
        )
        manifest = self.manifest.model_copy(
            update={
                "command": command,
                "data": tuple(data_inputs),
                "logs": logs,
                "parent": self.bundle_id,
                "created_at": datetime.now(UTC),
                "minimization": Minimization(data=kept, args=args, oracle_calls=self.oracle_calls),
            }
        )
        bundle_id = write_bundle(self.store, manifest)
        return MinimizeResult(
            bundle_id=bundle_id,
            data=kept,
            args=args,
            oracle_calls=self.oracle_calls,
            replays=self.replays,
        )

    def _put_text(self, text: str) -> BlobRef:
        from flaketriage.bundle.redaction import Redactor

        redactor = Redactor()
        redactor.redact_env(self.replayer.base_env)  # learn this machine's secret values
        return self.store.put_bytes(redactor.redact_text(text).encode())
