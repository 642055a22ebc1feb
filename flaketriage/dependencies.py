"""Optional dependencies: import one where it is used, or say exactly which extra installs it.

Every optional library (torch, numpy, hypothesis, boto3, ...) is imported through `require`, so a
missing one is always the same `MissingDependencyError`, naming ``pip install 'flaketriage[extra]'``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from flaketriage.errors import MissingDependencyError

__all__ = ["require"]


def require(module: str, extra: str, needed_for: str | None = None) -> ModuleType:
    """Import ``module`` (``"torch"``, ``"scipy.stats"``, ...) and return it.

    Raises `MissingDependencyError` naming ``pip install 'flaketriage[<extra>]'`` when the module,
    or a library it needs, is not installed; `needed_for` says what wanted it (default: the module).
    Any other import failure (a broken installation) propagates as it is.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or module).partition(".")[0]
        raise MissingDependencyError(missing, extra, needed_for or module) from exc
