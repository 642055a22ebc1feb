"""Interrupts: SIGINT, SIGTERM and SIGHUP as exceptions that unwind cleanly, and held back while a
child process starts.

CI cancellation, ``timeout`` and ``docker stop`` send SIGTERM; a closed terminal sends SIGHUP. Once
`install` ran (the CLI does, in its main thread) each becomes an exception, so ``finally`` blocks
end the command's processes and remove temporary workspaces on the way out: SIGINT raises
KeyboardInterrupt as usual, SIGTERM and SIGHUP raise `Terminated`. A signal that arrives while a
child is being started waits (`Hold`) until the caller has its process id and can end it.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_held: list[int] | None = None


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived. A BaseException, like KeyboardInterrupt: no ``except Exception``
    may swallow it. The process should exit with status 128 + `signum`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def install() -> None:
    """Raise on SIGINT, SIGTERM and SIGHUP from now on (call from the main thread).

    A signal the process was started with ignored (``nohup``) stays ignored.
    """
    for signum in _CAUGHT:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _handle)


def _handle(signum: int, frame: FrameType | None) -> None:
    if _held is not None:
        _held.append(signum)
        return
    _raise(signum)


def _raise(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    for other in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(other, signal.SIG_IGN)  # a second one must not cut the clean-up short
    raise Terminated(signum)


class Hold:
    """Holds back the interrupts `install` raises, from creation until `release`.

    Only the main thread receives them, so elsewhere it holds nothing.
    """

    def __init__(self) -> None:
        global _held
        self.active = threading.current_thread() is threading.main_thread() and _held is None
        if self.active:
            _held = []

    def release(self) -> None:
        """Stop holding; raise the first interrupt that arrived meanwhile."""
        global _held
        if not self.active:
            return
        pending, _held = _held, None
        self.active = False
        if pending:
            _raise(pending[0])
