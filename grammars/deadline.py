"""Compiling within ``compile_timeout``: the time one call has left, and how each backend's work is stopped.

``compile_timeout=T`` bounds one :func:`grammars.compile_grammar` call: ``T``
seconds are shared by everything the call compiles -- the backend asked for,
the other backends tried to suggest one after a refusal, and
``backend="auto"``'s fallbacks -- each compile getting the time the ones
before it left (:class:`Budget`).  Once ``T`` is spent, nothing more is
compiled (cached grammars and remembered errors still answer), and the
message says which backends were not tried.  Within a compile the work is
stopped per backend (:func:`compile_within`):

* a backend that serialises its grammars (xgrammar, outlines-core) compiles
  in a forked worker process (it inherits the tokenizer-level state, so it
  starts in milliseconds) that sends the serialised grammar back; past the
  deadline the worker is killed, so no CPU or memory is spent on that grammar
  afterwards and no thread or process is left running.  Without a deadline
  it compiles in-process (no fork).
* one that does not (llguidance) compiles in-process under its own resource
  limits (``LLParserLimits``: lexer fuel, grammar size), which bound the
  work; a compile that still ends past the deadline is refused like a
  timeout.

The worker is a plain ``os.fork`` with a pipe, not a :mod:`multiprocessing`
process: multiprocessing refuses to start a child from a daemonic process
("daemonic processes are not allowed to have children"), and a compile with
a deadline runs inside such processes too (every ``multiprocessing.Pool``
worker is one; so is ``tools/coverage_report.py``'s), where the deadline
must still stop a stuck native compile.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .base import CompiledGrammar, GrammarError, GrammarWarning
from .spec import GrammarSpec

if TYPE_CHECKING:
    from .registry import Backend

__all__ = ["CompileTimeout", "NotTried", "Budget", "compile_within", "LARGE_ENUM", "warn_if_slow"]

#: From how many values an ``enum`` makes xgrammar slow to compile (about 1.5 s at 20,000, 62 s at 100,000).
LARGE_ENUM = 10_000

_fork_lock = threading.Lock()


class CompileTimeout(GrammarError):
    """A backend did not compile the grammar within ``compile_timeout`` (its work was stopped)."""


class NotTried(CompileTimeout):
    """A backend was not tried: the call's ``compile_timeout`` was spent before it (nothing is remembered)."""


class Budget:
    """The compile time one :func:`compile_grammar` call has left (``compile_timeout``), over every backend it tries.

    Spent by each compile as it runs (wall time); building a tokenizer-level
    state is given back (it is not the grammar's work, and it is built once
    per tokenizer).  ``total=None``: no deadline.  One call's own: not shared.
    """

    def __init__(self, total: float | None) -> None:
        self.total = total
        self.spent = 0.0

    def left(self, limit: float | None = None) -> float | None:
        """Seconds left (``None``: no deadline), at most ``limit``."""
        if self.total is None:
            return limit
        left = max(0.0, self.total - self.spent)
        return left if limit is None else min(left, limit)

    def spend(self, seconds: float) -> None:
        self.spent += seconds


def compile_within(
    backend: Backend,
    prepared: Any,
    spec: GrammarSpec,
    vocab_size: int,
    stops: tuple[int, ...],
    timeout: float | None,
    total: float | None = None,
) -> CompiledGrammar:
    """Compile ``spec`` on ``backend`` within ``timeout`` seconds (see the module docstring for how).

    ``total``: the call's whole ``compile_timeout``, when ``timeout`` is what is left of it (for the message).
    """
    name = backend.name
    if timeout is None:
        return backend.compile_spec(prepared, spec, vocab_size, stops)
    serialize, deserialize = backend.serialize, backend.deserialize
    if serialize is None or deserialize is None or not hasattr(os, "fork"):  # bounded by the backend's own limits
        started = time.monotonic()
        compiled = backend.compile_spec(prepared, spec, vocab_size, stops)
        if time.monotonic() - started > timeout:
            raise CompileTimeout(_timeout_message(name, spec, timeout, "it finished late and was dropped", total))
        return compiled
    payload = _in_worker(
        lambda: serialize(backend.compile_spec(prepared, spec, vocab_size, stops)), timeout, name, spec, total
    )
    grammar: Any = deserialize(prepared, payload, vocab_size, stops)  # nbytes: each backend's own attribute
    if int(getattr(grammar, "nbytes", 0)) < len(payload):
        # A grammar read back from its serialised form holds about that many bytes: xgrammar's deserialised
        # grammars measured 0.9 to 1x their JSON (218 MB for 112 corpus schemas, SmolLM2), where its
        # memory_size_bytes said 31 MB -- an estimate that low made the byte bound no bound.
        grammar.nbytes = len(payload) + 4096
    return grammar


def _in_worker(
    work: Callable[[], bytes], timeout: float, name: str, spec: GrammarSpec, total: float | None = None
) -> bytes:
    """``work()`` in a forked child process; its bytes, or :class:`CompileTimeout` after killing it at the deadline.

    The child inherits the parent's memory (the tokenizer-level state is
    already built) and writes one tagged message to a pipe: ``R`` + result,
    ``G`` + a GrammarError's message, ``E`` + any other error.  The child is
    always reaped: no process outlives this call.
    """
    read_end, write_end = os.pipe()
    with _fork_lock:  # one fork at a time
        pid = os.fork()
    if pid == 0:  # the child: compile, report, exit without running the parent's clean-up
        status = 0
        try:
            os.close(read_end)
            try:
                message = b"R" + work()
            except GrammarError as e:
                message = b"G" + str(e).encode()
            except BaseException as e:  # reported to the parent
                message = b"E" + f"{type(e).__name__}: {e}".encode()
            view = memoryview(message)
            while view:
                view = view[os.write(write_end, view) :]
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    reaped = False
    try:
        while True:
            left = deadline - time.monotonic()
            ready = select.select([read_end], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                reaped = True
                raise CompileTimeout(_timeout_message(name, spec, timeout, "its worker process was killed", total))
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        _, status = os.waitpid(pid, 0)
        reaped = True
    finally:
        os.close(read_end)
        if not reaped:  # interrupted (KeyboardInterrupt, ...): stop the child too
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    data = b"".join(chunks)
    chunks.clear()
    if not data:
        how = (
            f"signal {-os.waitstatus_to_exitcode(status)}"
            if os.WIFSIGNALED(status)
            else f"status {os.waitstatus_to_exitcode(status)}"
        )
        raise GrammarError(
            f"the {name} compile worker process ended without a result ({how}; out of memory?); "
            "simplify the schema, or compile without compile_timeout to see the backend's own error"
        )
    tag, body = data[:1], data[1:]
    if tag == b"R":
        return body
    if tag == b"G":
        raise GrammarError(body.decode(errors="replace"))
    raise GrammarError(f"{name} failed while compiling the grammar: {body.decode(errors='replace')}")


def _timeout_message(name: str, spec: GrammarSpec, timeout: float, how: str, total: float | None = None) -> str:
    """Why ``name`` stopped; ``total``: the call's ``compile_timeout`` when ``timeout`` was only what it had left."""
    hint = ""
    values = _largest_enum(spec.schema) if spec.is_json else 0
    if name == "xgrammar" and values >= LARGE_ENUM:
        hint = (
            f" This schema has an enum of {values:,} values, and xgrammar's compile time grows fast with it "
            "(about 1.5 s at 20,000 values, 62 s at 100,000)."
        )
    within = f"compile_timeout={timeout:g} s"
    if total is not None and timeout < total:
        within = (
            f"the {timeout:.3g} s left of compile_timeout={total:g} s (the backends tried before it spent the rest)"
        )
    return (
        f"{name} did not compile the grammar within {within} ({how}; it uses no more CPU "
        f"or memory).{hint} Raise compile_timeout, or simplify the schema."
    )


def warn_if_slow(name: str, spec: GrammarSpec) -> None:
    """Warn before a compile that is known to take long without a deadline (xgrammar on a large enum)."""
    if name != "xgrammar" or not spec.is_json:
        return
    values = _largest_enum(spec.schema)
    if values >= LARGE_ENUM:
        warnings.warn(
            f"this schema has an enum of {values:,} values; xgrammar's compile time grows fast with it "
            "(about 1.5 s at 20,000 values, 62 s at 100,000), and nothing bounds it: pass compile_timeout=SECONDS "
            "to stop the compile past a deadline, or shorten the enum (a pattern, or a string checked afterwards)",
            GrammarWarning,
            stacklevel=5,
        )


def _largest_enum(schema: Any) -> int:
    """The number of values of the largest ``enum`` in ``schema``.  Pure."""
    from .spec import schema_nodes

    return max((len(n["enum"]) for n in schema_nodes(schema) if isinstance(n.get("enum"), list)), default=0)
