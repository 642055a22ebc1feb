"""The flaketriage error tree: every error the package raises on purpose.

::

    FlaketriageError                  catch this for "any flaketriage error"
    ├── ConfigError                   a setting or option has a value that cannot work
    ├── StoreError                    the content-addressed store
    │   ├── StoreNotWritableError     the store path cannot be created or written
    │   ├── ObjectNotFoundError       a blob or manifest the caller named is not there
    │   └── CorruptObjectError        a blob's bytes do not hash to its key
    ├── BundleError                   a bundle manifest, its id, or its export
    │   └── BundleNotFoundError       no bundle has that id (or prefix)
    ├── DatasetError                  a declared ``--data`` input: missing, or of an unknown format
    ├── CaptureError                  running and recording the failing command
    ├── SandboxError                  materializing a workspace or running a replay in isolation
    ├── MinimizeError                 reducing a failing bundle
    └── ReportError                   writing an issue or a quarantine entry

Messages say what was expected, what was seen, and what to do next, because they reach
people through the CLI without a traceback.
"""

from __future__ import annotations


class FlaketriageError(Exception):
    """Base of every error flaketriage raises on purpose."""


class ConfigError(FlaketriageError):
    """A setting or command-line option has a value that cannot work."""


class StoreError(FlaketriageError):
    """The content-addressed store failed."""


class StoreNotWritableError(StoreError):
    """The store path cannot be created or written."""


class ObjectNotFoundError(StoreError):
    """A blob or manifest named by its key is not in the store."""

    def __init__(self, key: str, where: str) -> None:
        super().__init__(
            f"object {key} is not in the store at {where}; the bundle that names it is incomplete "
            "or comes from another store (pass --store or set FLAKETRIAGE_STORE)"
        )
        self.key = key


class CorruptObjectError(StoreError):
    """A blob's bytes no longer hash to its key."""

    def __init__(self, key: str, actual: str, where: str) -> None:
        super().__init__(
            f"object {key} in {where} is corrupt: its content hashes to {actual}; "
            "it was not used. Re-capture the failure, or restore the object from a copy of the store"
        )
        self.key = key
        self.actual = actual


class BundleError(FlaketriageError):
    """A bundle manifest, its id, or its export is wrong."""


class BundleNotFoundError(BundleError):
    """No bundle in the store has the given id or id prefix."""


class DatasetError(FlaketriageError):
    """A declared data input is missing or of a format flaketriage cannot reduce."""


class CaptureError(FlaketriageError):
    """Running or recording the failing command failed."""


class SandboxError(FlaketriageError):
    """Materializing a workspace or running a replay in isolation failed."""


class MinimizeError(FlaketriageError):
    """Reducing a failing bundle failed."""


class ReportError(FlaketriageError):
    """Writing an issue or a quarantine entry failed."""
