"""``ledger.lua`` as the server runs it: a Redis Function where it can, EVALSHA where not.

A Function library is loaded once per server, so its constants and helpers are built once;
an EVALSHA script runs its whole file on every call. On a single Redis 7 that is about a
quarter of the script time of a claim and a commit (``tests/bench/ledger_bench.py``).

EVALSHA remains for Redis 6.2 (no Functions), for a user whose ACL allows scripts but not
``FCALL`` / ``FUNCTION``, and on a Redis Cluster (redis-py asks a cluster node for the keys
of every ``FCALL`` it routes: one more round trip per call). The two run the same file;
only its last line differs.

The library is named after a digest of its source, so a rolling upgrade loads the new one
beside the old (each release calls its own); ``FUNCTION LOAD`` never replaces a library.
A library lost since it was loaded (``FUNCTION FLUSH``, a restart without persistence) is
loaded again and the call sent once more: a call that met "function not found" did not run.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any, TypeVar

import redis
from redis.commands.core import Script

from .combiner import Combiner

__all__ = [
    "LIBRARY",
    "READER",
    "SOURCE",
    "LedgerScript",
    "Many",
    "first_error",
    "pipelined",
    "replies_of",
    "send",
]

T = TypeVar("T")

_pack: Callable[[tuple[Any, ...]], bytes] | None
try:  # the ``fast`` extra: a third of the CPU of redis-py's packer, which checks every arg
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover (CI installs it)
    _pack = None

SOURCE = resources.files(__package__).joinpath("ledger.lua").read_text(encoding="utf-8")
_EVAL_SOURCE = SOURCE + "\nreturn run(KEYS, ARGV)\n"
LIBRARY = "effectq_ledger_" + hashlib.sha1(SOURCE.encode("utf-8")).hexdigest()[:16]
# Two names for one entry point: the reads (op ``get``) go as a function flagged no-writes,
# which a full server (OOM) and a read-only replica still run; a write-capable function is
# refused whole by a server over maxmemory, before it runs.
READER = LIBRARY + "_ro"
_FUNCTION_SOURCE = (
    f"#!lua name={LIBRARY}\n{SOURCE}\n"
    f"redis.register_function('{LIBRARY}', run)\n"
    f"redis.register_function{{function_name='{READER}', callback=run, flags={{'no-writes'}}}}\n"
)


class _Held(threading.local):
    """Per thread: its connection, and the process that made it."""

    conn: Any = None
    pid = 0


def _ask(conn: Any, command: list[Any]) -> Any:
    """One command on ``conn``. An error reply leaves it in step; anything else that stops
    the call between send and reply — a socket error, a timeout, an exception raised into
    the thread (Dramatiq's time limit and shutdown) — closes it, so a late reply can never
    answer the thread's next call."""
    try:
        if _pack is not None:
            conn.send_packed_command([_pack(tuple(command))])
        else:
            conn.send_packed_command(conn.pack_command(*command))
        return conn.read_response()
    except redis.ResponseError:
        raise
    except BaseException:
        conn.disconnect()
        raise


def pipelined(conn: Any, commands: list[list[Any]]) -> list[Any]:
    """``commands`` in one write on ``conn``, then all their replies in order, an error
    reply as its exception in its place (every reply is read, so ``conn`` stays in step).
    Anything else that stops it closes ``conn``, as in ``_ask``. redis-py's pipeline does
    the same in about three times the CPU per command (its queue, callbacks and
    chunking; ``tests/bench/campaign_bench.py``)."""
    send(conn, commands)
    return replies_of(conn, len(commands))


def send(conn: Any, commands: list[list[Any]]) -> None:
    """The first half of ``pipelined``: ``commands`` written, their replies not read."""
    try:
        if _pack is not None:
            packed = b"".join(_pack(tuple(cmd)) for cmd in commands)
        else:
            packed = b"".join(c for cmd in commands for c in conn.pack_command(*cmd))
        conn.send_packed_command([packed])
    except BaseException:
        conn.disconnect()
        raise


def replies_of(conn: Any, count: int) -> list[Any]:
    """The second half of ``pipelined``: the next ``count`` replies on ``conn``."""
    try:
        replies: list[Any] = []
        for _ in range(count):
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        conn.disconnect()
        raise


def first_error(replies: list[Any]) -> list[Any]:
    """``replies``, or the first error among them raised (as ``Pipeline.execute``)."""
    for reply in replies:
        if isinstance(reply, redis.ResponseError):
            raise reply
    return replies


def _did_not_run(reply: Any) -> bool:
    return (
        isinstance(reply, redis.exceptions.NoScriptError)
        or _missing(reply)
        or _fcall_refused(reply)
    )


def _missing(exc: BaseException) -> bool:
    return isinstance(exc, redis.ResponseError) and "Function not found" in str(exc)


def _fcall_refused(exc: BaseException) -> bool:
    # An ACL that grants FUNCTION LIST / LOAD but not FCALL (a key outside the user's
    # patterns is refused with another message, and stays an error).
    return isinstance(exc, redis.exceptions.NoPermissionError) and "'fcall" in str(exc)


class LedgerScript:
    """Calls ``ledger.lua`` with (keys, args), directly or queued on a pipeline.

    Whether the server takes Functions is asked once, at the first call (``FUNCTION
    LIST``, then ``FUNCTION LOAD`` if the library is not there); ``functions=False`` never
    asks (a cluster). EVALSHA loads the script again on NOSCRIPT. Single calls go on a
    connection each thread keeps (``_connection``); on a cluster and in pipelines they go
    through redis-py's client (its Script for EVALSHA)."""

    def __init__(self, client: Any, *, functions: bool) -> None:
        self._client = client
        self._script = Script(client, _EVAL_SOURCE)
        self._functions: bool | None = None if functions else False
        self._lock = threading.Lock()
        self._held = _Held()
        self._combined: tuple[int, Combiner] | None = None
        # A cluster client routes each call itself (its connections are per node).
        self._pooled = isinstance(client, redis.RedisCluster)

    @property
    def functions(self) -> bool:
        """Calls go as FCALL (asks the server the first time)."""
        if self._functions is None:
            with self._lock:
                if self._functions is None:
                    self._functions = self._load()
        return self._functions

    def _load(self) -> bool:
        try:
            if not self._client.function_list(library=LIBRARY):
                try:
                    self._client.function_load(_FUNCTION_SOURCE)
                except redis.ResponseError as exc:
                    if "already exists" not in str(exc):  # another process loaded it first
                        raise
        except redis.ResponseError:
            # No Functions here (6.2, an ACL without them), or a server that cannot take
            # one now (a replica, OOM, loading): EVALSHA, whose answer then says what is
            # wrong as it did before Functions (MOVED on a cluster node, READONLY, OOM).
            return False
        return True

    def recover(self, exc: BaseException) -> bool:
        """After ``exc`` from a call: True when that call did not run and may be sent again
        — the library was lost and is loaded again, or FCALL is refused to this user and
        calls go by EVALSHA from now on."""
        if _missing(exc):
            with self._lock:
                self._functions = self._load()
            return True
        if _fcall_refused(exc):
            with self._lock:
                self._functions = False
            return True
        return False

    def again_if_lost(self, run: Callable[[], T]) -> T:
        """``run`` (one call, or a pipeline of them), once more when its error says the
        calls did not run and ``recover`` took it."""
        try:
            return run()
        except redis.ResponseError as exc:
            if not self.recover(exc):
                raise
        return run()

    def __call__(self, keys: list[str], args: list[Any], *, read_only: bool = False) -> Any:
        """One call; ``read_only`` for the ops that write nothing (``get``). As
        ``again_if_lost``, without a closure per call."""
        try:
            return self._once(keys, args, read_only)
        except redis.ResponseError as exc:
            if not self.recover(exc):
                raise
        return self._once(keys, args, read_only)

    def many(
        self, calls: list[tuple[list[str], list[Any]]], *, read_only: bool = False
    ) -> list[Any]:
        """Many calls in one round trip on this thread's connection (not on a cluster):
        their replies in order, an error reply as its exception. Calls that met a lost
        library or script cache did not run: they go again once it is loaded (a second
        time when FCALL was refused and EVALSHA then finds no script)."""
        return self.start_many(calls, read_only=read_only).replies()

    def start_many(
        self,
        calls: list[tuple[list[str], list[Any]]],
        *,
        read_only: bool = False,
        own_connection: bool = False,
    ) -> Many:
        """``many`` in two halves: the calls are on the wire when this returns, and
        ``Many.replies`` reads their replies, so the caller works while the server does.
        Until then no other call may use this thread's connection; with
        ``own_connection`` the calls go on one taken from the pool instead (given back
        once read), so the thread's other calls go on meanwhile."""
        pool = self._client.connection_pool if own_connection else None
        conn = pool.get_connection() if pool is not None else self._connection()
        try:
            send(conn, [self._command(*call, read_only) for call in calls])
        except BaseException:
            if pool is not None:
                pool.release(conn)
            raise
        return Many(self, conn, calls, read_only, pool)

    def commands(self, commands: list[list[Any]]) -> list[Any]:
        """Plain commands in one round trip on this thread's connection (not on a
        cluster); the first error reply raised."""
        return first_error(pipelined(self._connection(), commands))

    def _command(self, keys: list[str], args: list[Any], read_only: bool) -> list[Any]:
        if self.functions:
            return self._fcall(keys, args, read_only)
        return ["EVALSHA", self._script.sha, len(keys), *keys, *args]

    def _once(self, keys: list[str], args: list[Any], read_only: bool) -> Any:
        if self._pooled:
            return self._script(keys=keys, args=args)
        # Together with the calls other threads make meanwhile (``dedupe.combiner``).
        combiner, command = self._combiner(), self._command(keys, args, read_only)
        try:
            return combiner.call(self._connection, command)
        except redis.exceptions.NoScriptError:  # a restart or a failover emptied the cache
            _ask(self._connection(), ["SCRIPT", "LOAD", _EVAL_SOURCE])
            return combiner.call(self._connection, command)

    def _combiner(self) -> Combiner:
        """This process's combiner (``dedupe.combiner``): made again after a fork, whose
        child may hold a copy of a lock some parent thread had taken."""
        combined, pid = self._combined, os.getpid()
        if combined is None or combined[0] != pid:
            with self._lock:
                combined = self._combined
                if combined is None or combined[0] != pid:
                    combined = self._combined = (pid, Combiner(pipelined, _ask))
        return combined[1]

    def _connection(self) -> Any:
        """This thread's own connection to the server. Taking one from the pool and
        giving it back costs about as much CPU as the call itself (redis-py 8 counts every
        checkout for its metrics); a thread's calls are sequential, so it keeps one. Made
        again after a fork; a connection the server closed (a restart) is reopened before
        the call, as the pool does at checkout."""
        held, pid = self._held, os.getpid()
        conn = held.conn
        if conn is None or held.pid != pid:
            pool = self._client.connection_pool
            conn = held.conn = pool.connection_class(**pool.connection_kwargs)
            held.pid = pid
        elif conn._sock is not None:  # connected: check it before sending on it
            try:
                stale = conn.can_read()  # EOF or stray bytes: not a connection to send on
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                stale = True
            if stale:
                conn.disconnect()
        return conn

    def queue(
        self, pipe: Any, keys: list[str], args: list[Any], *, read_only: bool = False
    ) -> None:
        """Queue one call on ``pipe`` (run the pipeline through ``again_if_lost``)."""
        if self.functions:
            pipe.execute_command(*self._fcall(keys, args, read_only))
        else:
            self._script(keys=keys, args=args, client=pipe)

    @staticmethod
    def _fcall(keys: list[str], args: list[Any], read_only: bool) -> list[Any]:
        if read_only:
            return ["FCALL_RO", READER, len(keys), *keys, *args]
        return ["FCALL", LIBRARY, len(keys), *keys, *args]


class Many:
    """Calls ``LedgerScript.start_many`` put on the wire, their replies not read yet."""

    def __init__(
        self,
        script: LedgerScript,
        conn: Any,
        calls: list[tuple[list[str], list[Any]]],
        read_only: bool,
        pool: Any = None,
    ) -> None:
        self._script, self._conn, self._calls, self._read_only = script, conn, calls, read_only
        self._pool = pool  # the connection's pool, when it is not the thread's own

    def replies(self) -> list[Any]:
        """The replies in order, an error reply as its exception; the calls that did not
        run (a lost library or script cache) sent again once it is loaded, twice at most."""
        try:
            return self._replies()
        finally:
            self._release()

    def _replies(self) -> list[Any]:
        conn, script, calls = self._conn, self._script, self._calls
        replies = replies_of(conn, len(calls))
        todo = [i for i, reply in enumerate(replies) if _did_not_run(reply)]
        for _ in range(2):
            if not todo:
                break
            if isinstance(replies[todo[0]], redis.exceptions.NoScriptError):
                _ask(conn, ["SCRIPT", "LOAD", _EVAL_SOURCE])
            else:
                script.recover(replies[todo[0]])
            again = [script._command(*calls[i], self._read_only) for i in todo]
            for i, reply in zip(todo, pipelined(conn, again), strict=True):
                replies[i] = reply
            todo = [i for i in todo if _did_not_run(replies[i])]
        return replies

    def abandon(self) -> None:
        """Not read (the caller failed meanwhile): the connection is closed, so the
        replies can never answer a later call."""
        self._conn.disconnect()
        self._release()

    def _release(self) -> None:
        if self._pool is not None:
            self._pool.release(self._conn)
            self._pool = None
