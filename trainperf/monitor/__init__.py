"""Monitoring inside training: phase timer, FLOPs/MFU, device sampler, sinks, step log, profiler window.

For your own loop (what ``fit`` does for ``trainperf train``)::

    mon = trainperf.Monitor(cfg.monitor, "runs/mine")     # sampler thread, sinks
    t = mon.timer
    for step in range(1, n + 1):
        t0 = time.perf_counter()
        t.start_step(); t.phase("data"); ...; t.phase("forward"); ...; t.phase("backward"); ...
        phases = t.end_step()
        mon.after_step(step)
        mon.write({"step": step, "loss": loss.item(), "step_time_s": time.perf_counter() - t0,
                   "tokens_per_s": ..., "phases_s": phases})
    mon.close()                                            # then: trainperf diagnose runs/mine

Importing this package does not import torch; ``Monitor`` loads on first use. The diagnosis after the run,
the reports and compare are :mod:`trainperf.diagnosis` (``diagnose``, ``build_report`` and ``compare_runs``
are still handed on from here, deprecated, for one release).
"""

from __future__ import annotations

from trainperf.lazy import lazy_names, moved_names

_LAZY = {
    "Monitor": ("trainperf.monitor.monitor", "Monitor"),
    "PhaseTimer": ("trainperf.monitor.phases", "PhaseTimer"),
}
_MOVED = {"diagnose": "trainperf.diagnosis.engine", "build_report": "trainperf.diagnosis.report",
          "compare_runs": "trainperf.diagnosis.compare"}

__all__ = list(_LAZY)

_lazy = lazy_names("trainperf.monitor", globals(), _LAZY)
_moved = moved_names("trainperf.monitor", _MOVED)


def __getattr__(name: str):
    return _moved(name) if name in _MOVED else _lazy(name)
