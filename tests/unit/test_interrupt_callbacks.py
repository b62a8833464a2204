"""A signal whose handler runs inside a weakref callback or a ``__del__`` still stops the process.

Python runs a signal handler between any two bytecodes of the main thread, also inside such a callback, where
an exception can only be printed ("Exception ignored in ...") and is then lost. CI saw it in tune's trial
worker (SIGTERM inside importlib's module-lock callback): a traceback, and a worker that went on as if never
signalled. The same held for the command's own handler: the command went on and exited 0.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time, weakref
    from trainperf import interrupt

    if sys.argv[1] == "worker":
        interrupt.worker_signals(term="exit")
    else:
        interrupt.install()

    class Held:
        def __del__(self):
            if sys.argv[2] == "del":
                os.kill(os.getpid(), signal.SIGTERM)
                sum(range(1000))  # the handler runs here, inside __del__

    def callback(ref):
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(1000))  # the handler runs here, inside the callback

    held = Held()
    ref = weakref.ref(held, callback if sys.argv[2] == "weakref" else None)
    try:
        del held
        for _ in range(200):
            time.sleep(0.01)
        print("went on")
    except BaseException as exc:
        print("stopped by", type(exc).__name__)
        sys.exit(143 if isinstance(exc, (SystemExit, interrupt.Terminated)) else 1)
    finally:
        print("clean-up ran")
""")


@pytest.mark.parametrize("where", ["weakref", "del"])
@pytest.mark.parametrize("process", ["worker", "command"])
def test_a_signal_handled_inside_a_callback_stops_the_process_quietly(process, where):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, process, where], capture_output=True, text=True,
                          timeout=60)
    expected = "SystemExit" if process == "worker" else "Terminated"
    assert proc.stdout.splitlines() == [f"stopped by {expected}", "clean-up ran"], proc.stdout + proc.stderr
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_other_unraisable_errors_are_still_printed():
    code = textwrap.dedent("""
        from trainperf import interrupt
        interrupt.install()
        class Bad:
            def __del__(self):
                raise ValueError("a real error in __del__")
        b = Bad()
        del b
        print("went on")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "went on", proc.stdout + proc.stderr
    assert "Exception ignored" in proc.stderr and "a real error in __del__" in proc.stderr, proc.stderr


def test_a_signal_sent_again_into_a_deferred_block_waits_for_its_end():
    """The command's signal, lost in a callback just before a block that must not be cut in two, is sent again:
    it is held to the block's end (the handler is not set back over the block's own), then stops the command."""
    code = textwrap.dedent("""
        import signal, time
        from types import SimpleNamespace
        from trainperf import interrupt
        interrupt.install()
        interrupt._state["first"] = signal.SIGTERM  # as handle() records it before it raises
        lost = interrupt.Terminated()
        interrupt._state["raised"] = (lost, signal.SIGTERM, None)
        inside = []
        try:
            with interrupt.deferred():
                import sys
                sys.unraisablehook(SimpleNamespace(exc_value=lost, exc_type=type(lost)))
                for _ in range(50):
                    time.sleep(0.01)  # the signal sent again arrives here, and is held
                inside.append("block finished")
        except interrupt.Terminated:
            print(inside, "then stopped")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "['block finished'] then stopped", proc.stdout + proc.stderr
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
