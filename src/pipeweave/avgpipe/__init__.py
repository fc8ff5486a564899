"""AvgPipe's run-time and planning parts that need no process group (avgpipe.txt §4.2, §5.2).

* :mod:`.equations` — Equations 1-8 (the performance and memory model), one function each;
* :mod:`.profile` — :class:`TuningProfile`, one setting's profile, from a measured or simulated
  timeline;
* :mod:`.tuner` — :func:`predict` / :func:`tune` (profiling-based) and :func:`traverse`;
* :mod:`.controller` — :class:`AdvanceController`, Algorithm 1's advance forward propagation;
* :mod:`.simulated` — the simulator as measuring instrument for a model's settings;
* :mod:`.sources` — a setting run for real on local processes (the tuner's profile and the
  traversal's measurement), and the built-in models' simulated source (imports torch).

The elastic-averaging runtime (the ``AV`` action) lives in :mod:`pipeweave.runtime`.
"""

from .controller import AdvanceController, AdvanceStep, run_controller
from .profile import RankProfile, TuningProfile, profile_from_simulation, profile_from_timeline
from .tuner import (Measurement, Prediction, RankPrediction, TraversalResult, TuneResult, predict,
                    traverse, tune)

__all__ = [
    "AdvanceController", "AdvanceStep", "run_controller", "RankProfile", "TuningProfile",
    "profile_from_timeline", "profile_from_simulation", "Prediction", "RankPrediction",
    "Measurement", "TuneResult", "TraversalResult", "predict", "tune", "traverse",
]
