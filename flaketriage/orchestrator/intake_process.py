"""The intake in a process of its own, so that the receiver's event loop keeps its interpreter.

The receiver is bound by its interpreter lock: the event loop parses, checks and answers every
request, and recording a batch (the SQL, its JSON documents, the broker message) is Python too.
On a database that takes concurrent writers, `IntakeProcess` records in a child process (spawned:
an interpreter of its own) while the loop goes on with the next requests:

* the loop sends the deliveries of one turn down a pipe in one write;
* the child reads all that waits, records it as one batch (one transaction, `record_each`), hands
  its work to the broker, and writes the batch's outcomes back in one message;
* the loop reads the outcomes itself (``add_reader``: no thread of the receiver's has to win the
  interpreter lock from the loop first) and answers the requests.

202 keeps its meaning: an outcome comes back only once the child has committed its delivery and
handed its work to the broker. The child belongs to the receiver: it ignores Ctrl-C (the receiver
drains it on shutdown) and ends when its pipe closes, so it never outlives the receiver. A child
that dies (killed, out of memory) fails what it held with `RecordsError` (503: the sender retries,
and a delivery the child had committed is then answered as a duplicate); the next delivery starts
a new child.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import gc
import itertools
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from flaketriage.errors import BrokerError, RecordsError
from flaketriage.orchestrator.intake import IntakeResult, Item, Sighting, build_intake
from flaketriage.orchestrator.intake_queue import record_each, settle
from flaketriage.orchestrator.sender import receiver_sender
from flaketriage.records import Database
from flaketriage.settings import Settings

_Request = tuple[int, str, str, str, Sequence[Sighting]]
"""A delivery on its way to the child: its token, source, id, kind and sightings."""
_Answer = tuple[int, IntakeResult | None, BaseException | None]
_Waiting = tuple["asyncio.Future[IntakeResult]", tuple[str, str, str, Sequence[Sighting]]]

_HEADER = struct.Struct("!I")
"""A message on either pipe: its length, then a pickle."""
PIPE_BYTES = 1 << 20
"""Pipe capacity asked for (Linux's default limit for a user): the deliveries of a burst wait in the
pipe while the child records a batch, and the loop's write never waits."""


class IntakeProcess:
    """Records deliveries in a child process that builds its intake from `settings`."""

    def __init__(self, settings: Settings, *, max_batch: int = 256) -> None:
        self.settings = settings
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._child: _Child | None = None
        self._tokens = itertools.count(1)
        self._turn: list[_Waiting] = []
        """What requests sent since the loop last flushed."""
        self._flushing = False

    def start(self) -> None:
        """Start the child now rather than with the first delivery (it takes a second to start)."""
        with self._lock:
            self._running()

    async def record(
        self, source: str, delivery_id: str, kind: str, sightings: Sequence[Sighting]
    ) -> IntakeResult:
        """The delivery's result once the child recorded it and sent its work; `RecordsError`
        (nothing recorded, or the child died before answering), `BrokerError` (recorded, not sent)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[IntakeResult] = loop.create_future()
        with self._lock:
            self._turn.append((waiter, (source, delivery_id, kind, tuple(sightings))))
            flush, self._flushing = not self._flushing, True
        if flush:  # once this turn's requests have all had their say
            loop.call_soon(self._flush, loop)
        return await waiter

    def close(self) -> None:
        """Record and answer what was sent, then stop the child. A delivery of the loop's current
        turn, not sent yet, is refused (`RecordsError`: retry)."""
        with self._lock:
            child, self._child = self._child, None
            turn, self._turn = self._turn, []
        if turn:
            error = RecordsError("the receiver is shutting down: retry")
            settle([(waiter, None, error) for waiter, _ in turn])
        if child is not None:
            child.stop()

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            turn, self._turn, self._flushing = self._turn, [], False
            if not turn:
                return
            for _ in range(2):  # a child found gone never read these: a new one takes them
                child = self._running()
                if child.send([(next(self._tokens), *args) for _, args in turn], [w for w, _ in turn], loop):
                    return
                self._child = None
        error = RecordsError("the intake process could not take deliveries; retry")
        settle([(waiter, None, error) for waiter, _ in turn])

    @property
    def pid(self) -> int | None:
        """The child's process id; None while there is none."""
        child = self._child
        return child.pid if child is not None and child.alive else None

    def _running(self) -> _Child:
        if self._child is None or not self._child.alive:
            self._child = _Child.start(self.settings, self.max_batch)
        return self._child


class _Child:
    """One child process, the pipes to it, and the waiters of what it holds.

    Both pipes are read and written without blocking, on the loop of the requests (``add_reader``,
    ``add_writer``): the loop never waits for the child, and a child writing outcomes the loop has
    not read yet never waits for a loop that is itself waiting to write to the child."""

    def __init__(self, process: subprocess.Popen[bytes], requests: int, answers: int) -> None:
        self.process = process
        self._requests = requests
        self._answers = answers
        self.waiting: dict[int, asyncio.Future[IntakeResult]] = {}
        self.alive = True
        self._lock = threading.Lock()
        self._in = bytearray()
        self._out = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writing = False
        self._closed = False
        os.set_blocking(requests, False)
        os.set_blocking(answers, False)

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, settings: Settings, max_batch: int) -> _Child:
        """A new interpreter running `main`, its settings the first message down its pipe. Started
        as a command, not through multiprocessing: it never runs the receiver's main module again
        (which a script without a ``__main__`` guard would not survive)."""
        requests_in, requests_out = os.pipe()
        answers_in, answers_out = os.pipe()
        for end in (requests_out, answers_out):
            with contextlib.suppress(OSError):  # a smaller pipe only means more turns of the loop
                fcntl.fcntl(end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        command = [sys.executable, "-c", _CHILD_MAIN, str(requests_in), str(answers_out)]
        # It imports flaketriage from where the receiver did.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        try:
            with _ignoring_ctrl_c():
                process = subprocess.Popen(command, env=env, pass_fds=(requests_in, answers_out))
        except OSError:
            for fd in (requests_in, requests_out, answers_in, answers_out):
                os.close(fd)
            raise
        finally:
            with contextlib.suppress(OSError):
                os.close(requests_in)  # the child's ends, closed here so either side sees the other go
                os.close(answers_out)
        child = cls(process, requests_out, answers_in)
        child._out += _frame((settings, max_batch))
        return child

    def send(
        self,
        requests: list[_Request],
        waiters: list[asyncio.Future[IntakeResult]],
        loop: asyncio.AbstractEventLoop,
    ) -> bool:
        """Hand `requests` to the child, their outcomes read on `loop`; False when the child is
        known to be gone (then it holds none of them)."""
        with self._lock:
            if not self.alive:
                return False
            self._attach(loop)
            for (token, *_), waiter in zip(requests, waiters, strict=True):
                self.waiting[token] = waiter
            self._out += _frame(requests)
            self._write_some()
        return True

    def stop(self) -> None:
        """Tell the child to finish, read its last outcomes, and wait for it to end."""
        with self._lock:
            self._detach()
            if self.alive:
                self._out += _frame(None)
        ended = False
        while not ended:  # until the child closes its end: it has answered all it was sent
            writing = [self._requests] if self._out and self.alive else []
            readable, writable, _ = select.select([self._answers], writing, [], 60)
            if not readable and not writable:
                break  # a child that hangs: killed below
            if writable:
                with self._lock:
                    self._write_some()
            if readable:
                ended = self._readable()
        with self._lock:
            self._closed = True
            os.close(self._requests)
            os.close(self._answers)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    # -- on the loop (or in `stop`), under the lock ---------------------------------------------
    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is self._loop:
            return
        self._detach()  # the requests come from another loop now
        self._loop = loop
        loop.add_reader(self._answers, self._readable)
        if self._out:
            loop.add_writer(self._requests, self._writable)
            self._writing = True

    def _detach(self) -> None:
        loop, self._loop = self._loop, None
        writing, self._writing = self._writing, False
        if loop is None or loop.is_closed():
            return
        reader, writer = self._answers, self._requests

        def remove() -> None:
            loop.remove_reader(reader)
            if writing:
                loop.remove_writer(writer)

        if _running_loop() is loop:
            remove()
        else:
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(remove)

    def _write_some(self) -> None:
        try:
            while self._out:
                del self._out[: os.write(self._requests, self._out)]
        except BlockingIOError:
            pass
        except OSError:  # the child is gone: what it holds hears so when its end is read
            self._out.clear()
            self.alive = False
        wanted = bool(self._out) and self._loop is not None
        if wanted != self._writing and self._loop is not None:
            if wanted:
                self._loop.add_writer(self._requests, self._writable)
            else:
                self._loop.remove_writer(self._requests)
            self._writing = wanted

    def _writable(self) -> None:
        with self._lock:
            if not self._closed:
                self._write_some()

    def _readable(self) -> bool:
        """Read the outcomes that arrived and settle their waiters; True once the child is gone."""
        with self._lock:
            if self._closed:
                return True
            ended = False
            while True:
                try:
                    chunk = os.read(self._answers, PIPE_BYTES)
                except BlockingIOError:
                    break
                except OSError:
                    chunk = b""
                if not chunk:
                    ended = True
                    break
                self._in += chunk
            answers: list[_Answer] = []
            while len(self._in) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self._in)
                if len(self._in) < _HEADER.size + size:
                    break
                answers.extend(pickle.loads(self._in[_HEADER.size : _HEADER.size + size]))
                del self._in[: _HEADER.size + size]
            settled = [(self.waiting.pop(token), result, error) for token, result, error in answers]
            lost: list[asyncio.Future[IntakeResult]] = []
            if ended:
                self.alive = False
                self._out.clear()
                lost, self.waiting = list(self.waiting.values()), {}
                self._detach()
        settle(settled)
        if ended:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)  # it closed its end: it is ending
        if lost:
            error = RecordsError(
                f"the intake process stopped (exit code {self.process.returncode}) before answering: "
                "retry (a delivery it had recorded is answered as a duplicate)"
            )
            settle([(waiter, None, error) for waiter in lost])
        return ended


@contextlib.contextmanager
def _ignoring_ctrl_c() -> Iterator[None]:
    """Ctrl-C reaches the whole process group, a child that is still starting too: one started
    with SIGINT ignored ignores it from its first instruction (an ignored signal stays ignored
    across exec, and Python keeps it so). Only the main thread may set it; for the moment of the
    start, the receiver ignores it too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _frame(message: object) -> bytes:
    data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _write(fd: int, message: object) -> None:
    """Write `message` whole (the child's side: its pipe blocks)."""
    view = memoryview(_frame(message))
    while view:
        view = view[os.write(fd, view) :]


# -- the child's side ------------------------------------------------------------------------------
def _portable(error: BaseException | None) -> BaseException | None:
    """`error` as the receiver can rebuild it: its type and message (no traceback, no cause)."""
    if error is None:
        return None
    if isinstance(error, RecordsError | BrokerError):
        return type(error)(str(error))
    return RecordsError(f"recording failed ({type(error).__name__}: {error})")


def _read_exactly(fd: int, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _read(fd: int) -> Any:
    """The next message from the receiver; None when it says stop or is gone."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    data = _read_exactly(fd, _HEADER.unpack(header)[0])
    return None if data is None else pickle.loads(data)


_CHILD_MAIN = "import sys; from flaketriage.orchestrator.intake_process import main; main(sys.argv[1:])"


def main(argv: Sequence[str]) -> None:
    """The child: ``<requests fd> <answers fd>``. Reads its settings, then records what comes down
    its pipe, all that waits at once (up to a batch), until the receiver says stop or is gone, and
    sends each batch's outcomes back in one message."""
    requests, answers = int(argv[0]), int(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the receiver stops it, once it has drained
    opening = _read(requests)
    if opening is None:
        return
    settings, max_batch = opening
    database = Database(settings.resolved_database_url())
    intake = build_intake(settings, database, receiver_sender(settings))
    gc.collect()
    gc.freeze()  # what lives as long as the process: out of the collector's way (as the receiver)
    fd = requests
    pending: collections.deque[_Request] = collections.deque()
    stop = False
    try:
        while pending or not stop:
            # All that waits, up to a batch: a burst larger than a batch is recorded in several.
            while not stop and (
                not pending or (len(pending) < max_batch and select.select([fd], [], [], 0)[0])
            ):
                items = _read(fd)
                if items is None:
                    stop = True
                else:
                    pending.extend(items)
            batch = [pending.popleft() for _ in range(min(max_batch, len(pending)))]
            if batch:
                items_: list[Item] = [(source, did, kind, seen) for _, source, did, kind, seen in batch]
                outcomes = record_each(intake, items_)
                _write(
                    answers,
                    [(r[0], res, _portable(err)) for r, (res, err) in zip(batch, outcomes, strict=True)],
                )
    finally:
        database.dispose()
        os.close(answers)
