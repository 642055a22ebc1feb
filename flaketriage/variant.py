"""A test's variant: what about the place it ran can change how it behaves (the OS, the Python, the
GPU model), as ``key=value`` pairs.

A test's identity in CI history and in the quarantine is the test and its variant: a test that
flakes on one GPU model and passes everywhere else is two histories, and quarantining it there
leaves its CPU runs reported. A variant is written sorted and comma-separated
(``gpu=NVIDIA H100,os=linux,python=3.12``), its key; an empty variant is the empty key.

The keys a runner gives itself are `current_variant`'s (``os``, ``python``, ``gpu``), and a team
adds its own with ``FLAKETRIAGE_VARIANT="shard=2,torch=2.5"`` (its values win). A bundle's manifest
gives the same values for the machine it was captured on (`flaketriage.bundle.variant`): the
``os`` of a `platform.platform()` string (`os_of_platform`) is the one ``sys.platform`` gives
there, and several GPU models are one value (`gpu_model_of`).
"""

from __future__ import annotations

import platform
import re
import sys
from collections.abc import Iterable, Mapping

from flaketriage.errors import ConfigError

MAX_PAIRS = 16
MAX_VALUE = 100
KEY_PATTERN = re.compile(r"[a-z][a-z0-9_.-]{0,31}")
VARIANT_VARIABLE = "FLAKETRIAGE_VARIANT"
GPU_VARIABLE = "FLAKETRIAGE_GPU"
"""The GPU model a runner states for itself (``none``, or empty, for no GPU): it stands for what
the machine's own reading would say, in the pytest plugin and in a bundle it captured alike."""

Variant = dict[str, str]
"""Sorted by key; values are single-line printable text."""


def checked_variant(
    pairs: Mapping[str, str] | Iterable[tuple[str, str]], where: str = "the variant"
) -> Variant:
    """`pairs` as a variant (sorted), or `ConfigError` naming what is wrong: a key that is not
    lowercase letters, digits, ``_.-`` (32 at most), a value with a comma, ``=``, a control
    character or more than 100 characters, or more than 16 pairs."""
    items = list(pairs.items()) if isinstance(pairs, Mapping) else list(pairs)
    if len(items) > MAX_PAIRS:
        raise ConfigError(f"{where} has {len(items)} keys; at most {MAX_PAIRS}")
    out: dict[str, str] = {}
    for key, value in items:
        if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
            raise ConfigError(
                f"{where}: {key!r} is not a variant key (lowercase letters, digits, '_', '.', '-'; "
                "at most 32, starting with a letter)"
            )
        if not isinstance(value, str):
            raise ConfigError(f"{where}: the value of {key!r} must be text")
        value = value.strip()
        if (
            not value
            or len(value) > MAX_VALUE
            or any(c in value for c in ",=")
            or any(not c.isprintable() for c in value)
        ):
            raise ConfigError(
                f"{where}: the value of {key!r} must be 1 to {MAX_VALUE} printable characters "
                "without ',' or '='"
            )
        out[key] = value
    return dict(sorted(out.items()))


def parse_variant(text: str, where: str = VARIANT_VARIABLE) -> Variant:
    """``"os=linux,python=3.12"`` as a variant; empty text is the empty variant."""
    pairs: list[tuple[str, str]] = []
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(f"{where}: {part.strip()!r} is not key=value (e.g. os=linux,gpu=A100)")
        pairs.append((key.strip(), value))
    return checked_variant(pairs, where)


def variant_key(variant: Mapping[str, str]) -> str:
    """The variant as one sorted string: what history rows and quarantine entries are keyed by."""
    return ",".join(f"{k}={variant[k]}" for k in sorted(variant))


def variant_covers(pattern: Mapping[str, str], actual: Mapping[str, str]) -> bool:
    """Whether a variant `pattern` (a quarantine entry's) names `actual`: every key it gives has the
    same value there. The empty pattern covers every variant."""
    return all(actual.get(k) == v for k, v in pattern.items())


def _os_name() -> str:
    # Digits dropped: ``freebsd14`` is ``freebsd``, as a `platform.platform()` string names it.
    name = {"win32": "windows", "cygwin": "windows", "darwin": "macos"}.get(sys.platform, sys.platform)
    return name.rstrip("0123456789") or name


def os_of_platform(text: str) -> str | None:
    """The ``os`` a `platform.platform()` string (``Linux-6.8.0-x86_64-with-glibc2.39``,
    ``macOS-14.4-arm64-arm-64bit``, ``Windows-11-10.0.22631-SP0``) stands for: the one
    `current_variant` gives on that machine; None when it says nothing (``unknown``)."""
    first = text.split("-", 1)[0].strip().lower()
    if first.startswith("cygwin"):
        return "windows"
    name = {"darwin": "macos", "macos": "macos", "windows": "windows"}.get(first, first.rstrip("0123456789"))
    return name if name and name != "unknown" else None


def gpu_model_of(names: Iterable[str]) -> str:
    """The ``gpu`` value of a machine's GPUs: their model, the distinct models sorted and joined
    with `` + `` when they differ, ``""`` (``gpu=none``) when there is none."""
    return " + ".join(sorted({name.strip() for name in names if name.strip()}))


def current_variant(env: Mapping[str, str], gpu_model: str | None = None) -> Variant:
    """This process's variant: ``os``, ``python`` (major.minor), ``gpu`` when `gpu_model` is given
    (``none`` when it is the empty string), then ``FLAKETRIAGE_VARIANT`` in `env` on top."""
    return machine_variant(
        os_name=_os_name(),
        python=".".join(platform.python_version_tuple()[:2]),
        gpu_model=gpu_model,
        env=env,
    )


def machine_variant(
    *, os_name: str | None, python: str | None, gpu_model: str | None, env: Mapping[str, str]
) -> Variant:
    """The variant of a machine described by its parts, each left out when None (unknown), then
    ``FLAKETRIAGE_VARIANT`` in `env` on top: what `current_variant` says of this one and
    `flaketriage.bundle.variant.variant_of_manifest` of the one a bundle was captured on."""
    base: dict[str, str] = {}
    if os_name:
        base["os"] = os_name
    if python:
        base["python"] = ".".join(python.split(".")[:2])
    if gpu_model is not None:
        base["gpu"] = _gpu_value(gpu_model)
    extra = parse_variant(env.get(VARIANT_VARIABLE, ""))
    return checked_variant({**base, **extra})


def _gpu_value(model: str) -> str:
    cleaned = "".join(c for c in model.replace(",", " ").replace("=", " ") if c.isprintable()).strip()
    return cleaned[:MAX_VALUE] or "none"
