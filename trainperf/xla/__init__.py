"""The XLA backend: trainperf's trainer on torch_xla devices (TPU, XLA:GPU, the CPU PJRT device).

    env.py      is torch_xla importable and built for this torch? (one clear message if not)
    runtime.py  the device, the step boundary (``torch_xla.sync``), collectives, XLA -> CPU state
    loader.py   batches moved to the device by torch_xla's ParallelLoader, with an exact data position

torch_xla is imported only inside these modules' functions, so trainperf imports without it.
The trainer's backend is ``trainperf.xla.backend``; the metrics and the ``xla_recompile`` rule are
``trainperf.monitor.xla``.
"""
