"""Your own loop, instrumented by one line: the same run directory as ``trainperf train``.

* Lightning: ``trainer = L.Trainer(callbacks=[trainperf.integrations.lightning.TrainperfCallback(run_dir="runs/x")])``
* Hugging Face: ``Trainer(..., callbacks=[trainperf.integrations.hf.TrainperfCallback(run_dir="runs/x")])``
* a plain loop: ``tp = trainperf.track("runs/x")``, then ``with tp.step(): with tp.phase("forward"): ...``

Then ``trainperf diagnose runs/x`` / ``trainperf report runs/x``. Each framework module imports
only its own framework (and torch); this package imports neither.
"""

from __future__ import annotations

from trainperf.lazy import lazy_names

_LAZY = {
    "track": ("trainperf.integrations.loop", "track"),
    "StepTracker": ("trainperf.integrations.loop", "StepTracker"),
    "StepRecorder": ("trainperf.integrations.core", "StepRecorder"),
}

__all__ = list(_LAZY)


__getattr__ = lazy_names("trainperf.integrations", globals(), _LAZY)
