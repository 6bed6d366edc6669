"""``dedupe.combiner``: threads' single calls written together, each answered with its own
reply or error, and a combiner never left stuck — by a failed write, an exception raised
into the writing thread, or a waiting thread that leaves. The write here is a function the
test holds open, so which calls share a write is decided, not hoped for; the same calls on
a real redis-server are ``tests/integration/test_combined_calls.py``."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from dedupe.combiner import Combiner

JOIN_S = 5.0


class Interrupted(BaseException):
    """Stands for Dramatiq's TimeLimitExceeded / Shutdown, raised into a thread."""


class Wire:
    """The write: records each batch; the first one waits until ``release()``."""

    def __init__(self, fail: Callable[[list[list[Any]]], BaseException | None] = lambda _: None):
        self.batches: list[list[str]] = []
        self.opened = threading.Event()
        self._gate = threading.Event()
        self._fail = fail

    def ask(self, conn: Any, command: list[Any]) -> Any:
        """A call written alone (nobody else calling): the same write, its reply raised."""
        (reply,) = self(conn, [command])
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def release(self) -> None:
        self._gate.set()

    def __call__(self, conn: Any, commands: list[list[Any]]) -> list[Any]:
        self.batches.append([c[0] for c in commands])
        if len(self.batches) == 1:
            self.opened.set()
            assert self._gate.wait(JOIN_S)
        if (exc := self._fail(commands)) is not None:
            raise exc
        return [
            redis.ResponseError(f"refused {c[0]}") if c[0].startswith("bad") else f"re:{c[0]}"
            for c in commands
        ]


class Caller(threading.Thread):
    def __init__(self, combiner: Combiner, name: str) -> None:
        super().__init__(daemon=True)
        self.combiner, self.command = combiner, [name]
        self.reply: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.reply = self.combiner.call(lambda: None, self.command)
        except BaseException as exc:  # the test reads what each thread heard
            self.error = exc


def queued(combiner: Combiner) -> int:
    return len(combiner._queue)


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + JOIN_S
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.001)


@pytest.fixture
def threads() -> Iterator[list[Caller]]:
    started: list[Caller] = []
    yield started
    for t in started:
        t.join(JOIN_S)
        assert not t.is_alive(), f"{t.command[0]} still waiting: the combiner is stuck"


def start(threads: list[Caller], combiner: Combiner, *names: str) -> list[Caller]:
    callers = [Caller(combiner, name) for name in names]
    for caller in callers:
        threads.append(caller)
        caller.start()
    return callers


def behind_an_open_write(
    threads: list[Caller], wire: Wire, *names: str
) -> tuple[Combiner, Caller, list[Caller]]:
    """A writer whose batch is on the wire, and ``names`` queued behind it."""
    combiner = Combiner(wire, wire.ask)
    (first,) = start(threads, combiner, "first")
    assert wire.opened.wait(JOIN_S)
    queued_behind = start(threads, combiner, *names)
    wait_until(lambda: queued(combiner) == len(names))
    return combiner, first, queued_behind


def test_calls_queued_behind_a_write_go_in_one_write_each_with_its_own_reply(
    threads: list[Caller],
) -> None:
    wire = Wire()
    _, first, behind = behind_an_open_write(threads, wire, "b", "c", "d")
    wire.release()
    for t in [first, *behind]:
        t.join(JOIN_S)
    assert wire.batches[0] == ["first"]
    assert sorted(wire.batches[1]) == ["b", "c", "d"] and len(wire.batches) == 2
    assert [t.reply for t in [first, *behind]] == ["re:first", "re:b", "re:c", "re:d"]


def test_an_error_reply_is_raised_by_its_own_call_only(threads: list[Caller]) -> None:
    wire = Wire()
    _, first, (ok, bad, ok2) = behind_an_open_write(threads, wire, "ok", "bad", "ok2")
    wire.release()
    for t in (first, ok, bad, ok2):
        t.join(JOIN_S)
    assert isinstance(bad.error, redis.ResponseError) and bad.reply is None
    assert (ok.reply, ok2.reply, ok.error, ok2.error) == ("re:ok", "re:ok2", None, None)


def test_a_failed_write_is_its_connection_error_to_every_call_in_it_and_the_next_call_goes(
    threads: list[Caller],
) -> None:
    def fail(commands: list[list[Any]]) -> BaseException | None:
        names = [c[0] for c in commands]
        return redis.ConnectionError("reset by peer") if "b" in names else None

    wire = Wire(fail)
    combiner, first, (b, c) = behind_an_open_write(threads, wire, "b", "c")
    wire.release()
    for t in (first, b, c):
        t.join(JOIN_S)
    assert first.reply == "re:first"
    # The same connection error to each (its words say whether anything was sent: a
    # connection that never opened is "connecting to", which the ledger sends once more).
    assert all(isinstance(t.error, redis.ConnectionError) and t.reply is None for t in (b, c))
    assert [str(t.error) for t in (b, c)] == ["reset by peer"] * 2
    # Nothing is left holding the role: a later call is written and answered.
    (later,) = start(threads, combiner, "later")
    later.join(JOIN_S)
    assert later.reply == "re:later"


def test_an_exception_raised_into_the_writer_is_its_own_the_others_hear_a_lost_connection(
    threads: list[Caller],
) -> None:
    def fail(commands: list[list[Any]]) -> BaseException | None:
        return Interrupted() if len(commands) > 1 else None

    wire = Wire(fail)
    combiner, first, behind = behind_an_open_write(threads, wire, "b", "c", "d")
    wire.release()
    for t in [first, *behind]:
        t.join(JOIN_S)
    interrupted = [t for t in behind if isinstance(t.error, Interrupted)]
    lost = [t for t in behind if isinstance(t.error, redis.ConnectionError)]
    assert len(interrupted) == 1 and len(lost) == 2  # the writer of [b, c, d], the others
    (later,) = start(threads, combiner, "later")
    later.join(JOIN_S)
    assert later.reply == "re:later"


def _raise_into(thread: threading.Thread) -> None:
    assert thread.ident is not None
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(Interrupted)
    )
    assert done == 1


def test_a_waiting_thread_that_leaves_does_not_strand_the_calls_behind_it(
    threads: list[Caller],
) -> None:
    wire = Wire()
    _, first, (leaver, stayer) = behind_an_open_write(threads, wire, "leaver", "stayer")
    _raise_into(leaver)  # as Dramatiq's time limit does, while it waits for its reply
    leaver.join(JOIN_S)
    assert isinstance(leaver.error, Interrupted)
    wire.release()  # the writer wakes the oldest queued call: the one whose thread left
    stayer.join(JOIN_S)
    first.join(JOIN_S)
    # The call behind it took the write over; the leaver's call went too (sent as asked,
    # its reply unread, as a single call's whose reply is lost).
    assert stayer.reply == "re:stayer"
    assert wire.batches == [["first"], ["leaver", "stayer"]]
