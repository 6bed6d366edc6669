"""Single ledger calls of a process's threads, written together.

A worker pool's threads each make two ledger calls per message (the claim, the commit),
and each round trip costs CPU on both sides (a write, a read, a turn of the server's event
loop). A thread whose call finds another thread's batch on the wire queues its call; the
next writer sends every queued call in one write and reads their replies in order (the
flat combining of Hendler et al., the write lock as the combiner's role). No call waits
for a timer: a queued call goes as soon as the write before it has its replies, and a
call made while nobody else calls goes alone, as it did before.

Nothing about a call changes but the socket it travels on: each is its own script call
(``FCALL``, or ``EVALSHA``), atomic on the server, answered in order. A call is on the
wire only after its thread asked for it, and its thread returns only with its own reply —
the claim still precedes the body and the commit's reply still precedes the ack. A batch
whose connection fails is that connection error to every call in it (the ledger decides
what may be sent again, as for a single call: ``_REPEATABLE``, and any call whose
connection never opened); an error reply is its own call's exception. An exception raised
into the writing thread (Dramatiq's time limit, its shutdown notice) is that thread's own;
the others in its batch hear a connection error.

A thread interrupted while it waits leaves its call to be written and its reply unread,
as a single call whose reply is lost; the threads behind it wake after ``_NUDGE_S`` at the
latest and take the write over themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis

__all__ = ["Combiner"]

# How long a queued call waits for its wake-up before it looks for itself: only a thread
# interrupted between its wake-up and its write makes a follower wait this long.
_NUDGE_S = 0.05


class _Call:
    __slots__ = ("command", "error", "reply", "state", "wake", "woken")

    def __init__(self, command: list[Any]) -> None:
        self.command = command
        self.state = _QUEUED
        self.reply: Any = None
        self.error: BaseException | None = None
        # A lock taken at birth: released to wake the waiting thread (settled, or its
        # turn to write). ``woken`` keeps it from being released twice.
        self.wake = threading.Lock()
        self.wake.acquire()
        self.woken = False

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.reply


_QUEUED, _SENT, _DONE = range(3)


def _lost() -> redis.ConnectionError:
    return redis.ConnectionError("the connection carrying this call closed before its reply")


def _heard(exc: BaseException) -> BaseException:
    """What a call hears when its batch's write raised ``exc``: the same connection error
    (its words say whether the connection ever opened, so whether anything was sent), or a
    lost connection for anything else (an exception raised into the writing thread)."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return type(exc)(*exc.args)
    return _lost()


class Combiner:
    """Writes the single calls of one process's threads, batch by batch (the module's
    docstring). ``write(conn, commands)`` sends ``commands`` on ``conn`` and returns their
    replies in order, an error reply as its exception in its place; ``ask(conn, command)``
    sends one and returns its reply (raises its error reply)."""

    def __init__(
        self,
        write: Callable[[Any, list[list[Any]]], list[Any]],
        ask: Callable[[Any, list[Any]], Any],
    ) -> None:
        self._write, self._ask = write, ask
        self._mutex = threading.Lock()  # the queue, the calls' states and wake flags
        self._writing = threading.Lock()  # the role: one batch on the wire at a time
        self._queue: list[_Call] = []

    def call(self, connection: Callable[[], Any], command: list[Any]) -> Any:
        """``command``'s reply; ``connection()`` gives this thread's own connection, which
        carries the batch when this thread writes it."""
        if not self._queue and self._writing.acquire(blocking=False):
            # Nobody else calling: the call alone, without the queue's bookkeeping. A call
            # queued meanwhile is nudged when this write is done, as behind any write.
            try:
                return self._ask(connection(), command)
            finally:
                self._writing.release()
                self._nudge_next()
        me = _Call(command)
        with self._mutex:
            self._queue.append(me)
        while True:
            if self._writing.acquire(blocking=False):
                try:
                    self._write_queued(connection, me)
                finally:
                    self._writing.release()
                    self._nudge_next()
                return me.result()
            got = me.wake.acquire(timeout=_NUDGE_S)
            with self._mutex:
                if not got and me.woken:  # released after the timeout: take it back
                    me.wake.acquire()
                me.woken = False
                if me.state == _DONE:
                    return me.result()

    def _write_queued(self, connection: Callable[[], Any], me: _Call) -> None:
        """With the role: write what is queued, ours among it, unless ours is settled."""
        with self._mutex:
            if me.state == _SENT:
                # Sent in a batch whose writer was interrupted before it settled it (no
                # batch is on the wire while we hold the role): its reply is lost.
                me.state, me.error = _DONE, _lost()
            if me.state == _DONE:
                return
            batch, self._queue = self._queue, []
            for call in batch:
                call.state = _SENT
        try:
            replies = self._write(connection(), [call.command for call in batch])
        except BaseException as exc:
            with self._mutex:
                for call in batch:
                    self._settle(call, None, exc if call is me else _heard(exc), me)
            return
        with self._mutex:
            for call, reply in zip(batch, replies, strict=True):
                if isinstance(reply, redis.ResponseError):
                    self._settle(call, None, reply, me)
                else:
                    self._settle(call, reply, None, me)

    def _settle(self, call: _Call, reply: Any, error: BaseException | None, me: _Call) -> None:
        # Under the mutex.
        call.reply, call.error, call.state = reply, error, _DONE
        if call is not me:
            self._wake(call)

    def _nudge_next(self) -> None:
        """Wake the oldest queued call's thread to write the next batch. (An empty queue
        read without the mutex is safe: a call queued after the read tries for the role
        after its release, and takes it.)"""
        if not self._queue:
            return
        with self._mutex:
            if self._queue:
                self._wake(self._queue[0])

    @staticmethod
    def _wake(call: _Call) -> None:  # under the mutex
        if not call.woken:
            call.woken = True
            call.wake.release()
