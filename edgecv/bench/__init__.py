"""``edgecv bench`` and the timing harness every script in ``benchmarks/`` shares.

- :mod:`.harness`: timed runs, alternating turns of several runtimes, percentiles;
- :mod:`.steps`: per-launch time of a loaded package (OpenCL event profiling on
  OpenCL, host timing of each synchronous launch on the CPU);
- :mod:`.baselines`: MXNet, ONNX Runtime and OpenVINO built from the package's source
  model (each one that is missing or fails to load is reported, not fatal);
- :mod:`.command`: the ``edgecv bench`` command itself.
"""

from .harness import Timings, alternate, alternating_medians, median_time, time_runs

__all__ = ["Timings", "alternate", "alternating_medians", "median_time", "time_runs"]
