"""Monitoring: phase timer, FLOPs/MFU, device sampler, sinks, profiler, diagnosis, report, compare.

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

Importing this package does not import torch; ``Monitor`` loads on first use.
"""

from __future__ import annotations

from trainperf.lazy import lazy_names

_LAZY = {
    "Monitor": ("trainperf.monitor.monitor", "Monitor"),
    "PhaseTimer": ("trainperf.monitor.phases", "PhaseTimer"),
    "diagnose": ("trainperf.monitor.diagnose", "diagnose"),
    "build_report": ("trainperf.monitor.report", "build_report"),
    "compare_runs": ("trainperf.monitor.compare", "compare_runs"),
}

__all__ = list(_LAZY)


__getattr__ = lazy_names("trainperf.monitor", globals(), _LAZY)
