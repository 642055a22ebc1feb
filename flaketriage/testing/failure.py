"""What an ML assertion failure is, and the seed and versions every failure message ends with.

A failing numeric check is only useful in a bug report with the seed that produced it and the
library versions that computed it, so every message carries both.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Mapping

from flaketriage.versions import format_cudnn_version

Context = str | Mapping[str, object] | None
"""Extra lines for a failure message: a sentence, or ``name: value`` pairs."""


class MLAssertionError(AssertionError):
    """An ML assertion failed: the data, not flaketriage, is wrong.

    An ``AssertionError``, so pytest reports it as a test failure with the message in full.
    """


def run_description(seed: int | None, context: Context = None) -> str:
    """The trailing lines of a failure message: context, seed, versions."""
    lines = _context_lines(context)
    lines.append(f"seed: {_seed_text(seed)}")
    lines.append(f"versions: {versions()}")
    return "\n".join(lines)


def versions_description(context: Context = None) -> str:
    """The trailing lines of a statistical check's message, whose ``seed`` is its own resampling."""
    return "\n".join([*_context_lines(context), f"versions: {versions()}"])


def versions() -> str:
    """``python 3.11.7, numpy 2.1.0, torch 2.4.0+cu121, CUDA 12.1, cuDNN 9.1.0``: what computed the values.

    torch and numpy are reported only when the program imported them, so describing a failure
    never imports torch.
    """
    parts = [f"python {platform.python_version()}"]
    np = sys.modules.get("numpy")
    if np is not None:
        parts.append(f"numpy {np.__version__}")
    torch = sys.modules.get("torch")
    if torch is not None:
        parts.append(f"torch {torch.__version__}")
        cuda = getattr(torch.version, "cuda", None)
        if cuda:
            parts.append(f"CUDA {cuda}")
        cudnn = _cudnn_version(torch)
        if cudnn:
            parts.append(f"cuDNN {cudnn}")
    return ", ".join(parts)


def _cudnn_version(torch: object) -> str | None:
    try:
        version = torch.backends.cudnn.version()  # type: ignore[attr-defined]
    except Exception:  # a broken CUDA install must not hide the assertion behind another error
        return None
    return format_cudnn_version(int(version)) if version else None


def _seed_text(seed: int | None) -> str:
    if seed is not None:
        return str(seed)
    torch = sys.modules.get("torch")
    if torch is None:
        return "unknown (pass seed=...)"
    return f"{torch.initial_seed()} (torch.initial_seed())"


def _context_lines(context: Context) -> list[str]:
    if context is None:
        return []
    if isinstance(context, str):
        return [f"context: {context}"]
    return [f"{name}: {value}" for name, value in context.items()]
