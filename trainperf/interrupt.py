"""Ctrl-C and SIGTERM: one way to stop, for every command and every process it starts.

The rule: the process the user started decides; the processes it started do not.

- The command's process (``trainperf ...``: :func:`install`, called by the CLI). The first SIGINT
  raises ``KeyboardInterrupt``, the first SIGTERM :class:`Terminated` (a ``KeyboardInterrupt``, so
  that every path that keeps what it has on Ctrl-C, tune's best so far, does the same on SIGTERM).
  Signals after the first are noted and ignored while the clean-up runs (a terminal's Ctrl-C reaches
  a torchrun rank twice: from the terminal and from the agent); the third ends the process at once
  (``os._exit``: a user pressing Ctrl-C again over a clean-up that hangs). The exit code is
  128 + the first signal: 130 (SIGINT), 143 (SIGTERM): :func:`exit_code`.
- Worker processes (tune's trials, loader workers, benchmark ranks, a busy-loop straggler) are
  started inside :func:`starting`: they begin life with SIGINT and SIGTERM blocked (the signal mask
  is inherited through fork and exec, and by a forkserver's children), and call
  :func:`worker_signals` first: SIGINT ignored (their parent closes them), SIGTERM ends them (at
  once, or by ``SystemExit`` so that their ``finally`` blocks release what they hold). No worker can
  raise a ``KeyboardInterrupt`` traceback during its start-up. A signal that reaches the parent while
  it starts them is held until the start is done and then delivered: a child is never started
  without the parent knowing it (the parent can always close what it started).
- A worker whose parent went away (its pipe closed: BrokenPipe, EOF, a reset connection) ends
  quietly: :func:`parent_gone` tells such an error apart. In a worker (one that called
  :func:`worker_signals`, or a process forked from the command, as a torch DataLoader's workers are) a
  background thread's connection error is quiet at any time: its other end is the command.

:func:`deferred` holds signals over a short section that must not be cut in two (writing a result).
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# first/extra: the signals received; pid: the process install() ran in (a process forked from it inherits the
# hooks and this state); worker: worker_signals() ran here
# raised: (the exception a handler raised, its signal, the handler to re-arm) until it is seen swallowed;
# again: a signal re-delivered because its exception was swallowed (see _unraisable_hook)
_state = {"first": None, "extra": 0, "pid": None, "worker": False, "raised": None, "again": None}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised the way Ctrl-C raises ``KeyboardInterrupt``."""


def received() -> int | None:
    """The first SIGINT / SIGTERM this process received through :func:`install`'s handler (None: none)."""
    return _state["first"] or None


def exit_code(exc: BaseException | None = None) -> int:
    """128 + the signal that interrupted: 130 for SIGINT (the default), 143 for SIGTERM."""
    first = _state["first"]
    if not first:
        first = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
    return 128 + int(first)


def describe(code: int | None = None) -> str:
    code = exit_code() if code is None else code
    return "terminated (SIGTERM)" if code == 128 + signal.SIGTERM else "interrupted"


def handle(signum, frame) -> None:
    """The command's handler (see the module doc); a handler of its own may hand a signal on to it."""
    if _state["first"] is None or _state["again"] == signum:
        _state["again"] = None
        if _state["first"] is None:
            _state["first"] = signum
            _children_may_end()
        # no re-arming: the signal sent again goes to whatever handles it then (handle, or a deferred block's
        # hold, which delivers it to handle at the block's end; after finished(), nothing)
        _raise_from_handler(Terminated() if signum == signal.SIGTERM else KeyboardInterrupt(), signum, None)
    _state["extra"] += 1
    if _state["extra"] >= 2:  # the third signal: a clean-up that does not end; stop now, quietly
        with contextlib.suppress(OSError):
            os.write(2, b"trainperf: interrupted again: stopping now, without cleaning up\n")
        os._exit(128 + int(_state["first"] or signum))


def _raise_from_handler(exc: BaseException, signum: int, rearm) -> None:
    """Raise ``exc`` from a signal handler, remembering it: Python runs a handler between any two bytecodes
    of the main thread, also inside a weakref callback or a ``__del__``, and an exception raised there is
    only printed ("Exception ignored in ...") and lost: the process went on as if never signalled (seen in
    tune's trial worker, inside importlib's module-lock callback). :func:`_unraisable_hook` sees it lost and
    sends the signal again, after setting ``rearm`` (if not None) as its handler."""
    _state["raised"] = (exc, signum, rearm)
    raise exc


def record(signum: int) -> None:
    """A signal that another handler of this command received (torchrun's agent, in `trainperf launch`, turns
    SIGINT / SIGTERM into its own ``SignalException``): the command is stopping all the same, so the CLI ends
    it through :func:`exit_now`, not the interpreter's shutdown (which, with the agent's C++ threads still
    there, aborted: "terminate called without an active exception", exit -6, issue 40)."""
    if _state["first"] is None:
        _state["first"] = signum


def _children_may_end() -> None:
    """Once stopping, a worker that ends (the same signal reached it) is expected: a Python SIGCHLD handler
    (torch's DataLoader raises "worker killed by signal" from one, even inside ``__del__`` at exit) becomes
    a no-op."""
    sigchld = getattr(signal, "SIGCHLD", None)
    if sigchld is None:
        return
    prev = signal.getsignal(sigchld)
    if callable(prev) and prev not in (signal.SIG_DFL, signal.SIG_IGN):
        signal.signal(sigchld, lambda n, f: None)


def finished() -> None:
    """The command has returned its exit code: SIGINT and SIGTERM are ignored while the interpreter shuts
    down (its last step resets Python's handlers to the defaults, and a signal then would replace the
    command's exit code by a death by signal; everything was closed before, so the shutdown is short)."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def exit_now(code: int) -> None:
    """End the interrupted command with ``code`` (130 / 143) for certain: the exit handlers run and the
    output is flushed, then the process exits without the interpreter's own shutdown. CPython ends a
    process *by* SIGINT at shutdown (exit -2) when it has flagged a ``KeyboardInterrupt`` as unhandled
    (``_Py_UnhandledKeyboardInterrupt``), which it can do for one the command caught and handled: seen
    beside a CPU hog, `trainperf bench step` interrupted 2 s in ended -2 in about one run of three, after
    printing that it was interrupted and ignoring SIGINT (tests/unit/test_interrupts.py)."""
    import atexit
    import sys

    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


_STOPPING_ERRORS = (ConnectionError, EOFError, BrokenPipeError)


def _in_worker() -> bool:
    """A worker process: one that called :func:`worker_signals`, or one forked from the command (a torch
    DataLoader's workers: they inherit the command's hooks and state, and never hear the user's signal)."""
    return _state["worker"] or (_state["pid"] is not None and os.getpid() != _state["pid"])


def _stopping_closed(exc_type) -> bool:
    """A background thread's connection error that the stopping caused: after a signal to the command; in a
    worker at any time, since its connections' other end is the command (a worker's resource sharer serves
    its batches' file descriptors to the command, and the command stopping, or going, mid-transfer resets
    it: issue 40, `bench data` stopped by SIGTERM printed the worker's ConnectionResetError)."""
    return issubclass(exc_type, _STOPPING_ERRORS) and (received() is not None or _in_worker())


def _thread_hook(prev):
    """A ``threading.excepthook`` that, once a signal stopped the command (in a worker: always), keeps quiet
    about a background thread whose connection the stopping closed (multiprocessing's resource sharer, a
    worker's pipe): that is part of stopping, not an error; every other exception goes to ``prev``."""
    def hook(args):
        if _stopping_closed(args.exc_type):
            return
        prev(args)
    hook.trainperf = True
    return hook


def _sys_hook(prev):
    """The same for ``sys.excepthook``, which multiprocessing's resource sharer calls from its own thread (not
    through ``threading.excepthook``) when the connection it was serving is reset by the stopping. Only in a
    thread other than the main one: the main thread's errors are the command's (or the worker's) own."""
    def hook(exc_type, exc, tb):
        if _stopping_closed(exc_type) and threading.current_thread() is not threading.main_thread():
            return
        prev(exc_type, exc, tb)
    hook.trainperf = True
    return hook


def _unraisable_hook(prev):
    """A ``sys.unraisablehook`` that, when the exception lost is the one a handler of this module raised (see
    :func:`_raise_from_handler`), prints nothing and sends the signal again: its handler then runs outside
    the callback, where the exception stops the process as it should (were it lost again, the same happens
    again). Everything else goes to ``prev``."""
    def hook(u):
        raised = _state["raised"]
        if raised is not None and u.exc_value is raised[0] and \
                threading.current_thread() is threading.main_thread():
            _state["raised"] = None
            _, signum, rearm = raised
            _state["again"] = signum
            if rearm is not None:  # a handler that set the signal ignored before it raised (a worker's)
                signal.signal(signum, rearm)
            # from another thread, a moment later: raised here, the handler would run before this hook
            # returns, and be lost again (threading.Thread.start waits, so the bare _thread is used)
            _thread.start_new_thread(_send_again, (signum,))
            return
        prev(u)
    hook.trainperf = True
    return hook


def _send_again(signum: int) -> None:
    time.sleep(0.005)
    os.kill(os.getpid(), signum)


def _wrap_hooks() -> dict:
    """Wrap ``threading.excepthook``, ``sys.excepthook`` and ``sys.unraisablehook`` once; returns the hooks
    replaced."""
    old = {}
    if not getattr(sys.unraisablehook, "trainperf", False):
        old["unraisablehook"] = sys.unraisablehook
        sys.unraisablehook = _unraisable_hook(sys.unraisablehook)
    if not getattr(threading.excepthook, "trainperf", False):
        old["excepthook"] = threading.excepthook
        threading.excepthook = _thread_hook(threading.excepthook)
    if not getattr(sys.excepthook, "trainperf", False):
        old["sys_excepthook"] = sys.excepthook
        sys.excepthook = _sys_hook(sys.excepthook)
    return old


def install() -> dict:
    """The command's handlers for SIGINT and SIGTERM (main thread only; a signal the caller set to be
    ignored, e.g. ``nohup`` or a background job, stays ignored). Returns the handlers replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    old = {}
    for sig in SIGNALS:
        prev = signal.getsignal(sig)
        if prev is not signal.SIG_IGN and prev is not None:
            old[sig] = signal.signal(sig, handle)
    _state["pid"] = os.getpid()
    old.update(_wrap_hooks())
    return old


def restore(old: dict) -> None:
    """Put back the handlers :func:`install` replaced and forget any signal (the CLI called in-process)."""
    for sig, handler in old.items():
        if sig == "excepthook":
            threading.excepthook = handler
        elif sig == "sys_excepthook":
            sys.excepthook = handler
        elif sig == "unraisablehook":
            sys.unraisablehook = handler
        else:
            signal.signal(sig, handler)
    reset()


def reset() -> None:
    """Forget a received signal (tests that call the CLI in one process several times)."""
    _state["first"], _state["extra"], _state["pid"] = None, 0, None
    _state["raised"] = _state["again"] = None


@contextlib.contextmanager
def deferred(mask: bool = False):
    """Hold SIGINT / SIGTERM over the block and deliver them at its end, in order. With ``mask`` they
    are also blocked in this thread, so that processes started inside inherit the block (see
    :func:`starting`)."""
    held: list[int] = []
    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            prev = signal.getsignal(sig)
            if prev is not signal.SIG_IGN and prev is not None:
                old[sig] = signal.signal(sig, lambda n, f: held.append(n))
    prev_mask = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS) if mask else None
    try:
        yield
    finally:
        if prev_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, prev_mask)
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in held:
            signal.raise_signal(sig)  # to the restored handler: as if it arrived now


def starting():
    """Start worker processes inside this block: they begin with SIGINT and SIGTERM blocked and must
    call :func:`worker_signals` first; a signal to this process meanwhile is delivered after the block."""
    _tracker_first()
    return deferred(mask=True)


def _tracker_first() -> None:
    """CPython's multiprocessing resource tracker, once it has started, *unblocks* SIGINT and SIGTERM in the
    thread that started it (``resource_tracker.ensure_running``: block, spawn, unblock). Started inside the
    block (by the first spawned process), it would end the block for every process started after it: a
    Ctrl-C while such a rank imported torch printed a KeyboardInterrupt traceback (``bench balance`` under
    load). So it is started before the block, wherever multiprocessing is in use."""
    import sys

    if "multiprocessing" not in sys.modules or os.name != "posix":
        return
    try:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    except Exception:  # noqa: BLE001 - no tracker: multiprocessing starts one itself, as before
        pass


def worker_signals(*, term: str = "default") -> None:
    """In a worker process, first thing: SIGINT ignored (the parent decides), SIGTERM ends the process
    (``term="default"``: at once, no Python code runs; ``term="exit"``: ``SystemExit(143)`` once, so that
    ``finally`` blocks release what the worker holds, then further ones are ignored), then the signals
    blocked by :func:`starting` are let through."""
    _state["worker"] = True  # a connection its parent closes mid-transfer is quiet (see _stopping_closed)
    _wrap_hooks()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if term == "exit":
        def _exit(signum, frame):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _raise_from_handler(SystemExit(128 + signum), signum, _exit)

        signal.signal(signal.SIGTERM, _exit)
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def parent_gone(exc: BaseException) -> bool:
    """A pipe or queue error that means the other end closed (the parent went away or shut down)."""
    return isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, EOFError)) or (
        isinstance(exc, OSError) and exc.errno in (9, 32, 104))  # EBADF (closed by us), EPIPE, ECONNRESET


# A busy loop that leaves Ctrl-C to its parent (benchmarks' outside straggler; tests' CPU hogs).
HOG_CODE = ("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
            "signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))\n"
            "while True:\n    pass\n")
