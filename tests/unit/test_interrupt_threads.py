"""After Ctrl-C / SIGTERM, a background thread whose connection the stopping closed (multiprocessing's resource
sharer, a worker's pipe) does not print a traceback; before any signal, and for any other error, it does."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from trainperf import interrupt


def test_a_connection_closed_by_the_stopping_is_quiet_other_errors_are_not():
    seen = []
    hook = interrupt._thread_hook(seen.append)
    reset = SimpleNamespace(exc_type=ConnectionResetError, exc_value=ConnectionResetError(104, "reset"))
    other = SimpleNamespace(exc_type=ValueError, exc_value=ValueError("a real error"))
    try:
        hook(reset)  # no signal yet: printed as ever
        assert seen == [reset]
        interrupt._state["first"] = 15  # as interrupt.handle records SIGTERM
        hook(reset)
        hook(other)
        assert seen == [reset, other]
    finally:
        interrupt.reset()


def test_install_wraps_the_thread_hook_once_and_restore_puts_it_back():
    before = threading.excepthook
    old = interrupt.install()
    try:
        assert getattr(threading.excepthook, "trainperf", False)
        again = interrupt.install()
        assert "excepthook" not in again
        interrupt.restore(again)
    finally:
        interrupt.restore(old)
    assert threading.excepthook is before


def test_the_resource_sharers_sys_excepthook_is_quiet_after_a_signal_in_its_thread_only():
    """multiprocessing's resource sharer reports its thread's error through ``sys.excepthook`` (as its
    ``_serve`` does): quiet after a signal in that thread; the main thread's errors are printed as ever."""
    import sys

    seen = []
    hook = interrupt._sys_hook(lambda *a: seen.append((threading.current_thread().name, a[0])))
    reset = (ConnectionResetError, ConnectionResetError(104, "reset"), None)
    try:
        interrupt._state["first"] = 15
        t = threading.Thread(target=hook, args=reset, name="sharer")
        t.start()
        t.join()
        assert seen == []
        hook(*reset)  # the main thread: its own error
        t = threading.Thread(target=hook, args=(ValueError, ValueError("x"), None), name="sharer")
        t.start()
        t.join()
        assert seen == [("MainThread", ConnectionResetError), ("sharer", ValueError)]
    finally:
        interrupt.reset()
    before = sys.excepthook
    old = interrupt.install()
    try:
        assert getattr(sys.excepthook, "trainperf", False)
    finally:
        interrupt.restore(old)
    assert sys.excepthook is before
