"""Measurement on this machine, between the runtime and the CLI: what the commands and the
benchmarks run for real to learn a number.

* calibration: a profile completed with the link, the runtime's costs per action and its
  all-reduce's bandwidth (:mod:`.calibration`, :mod:`.runtime_costs`, :mod:`.collective`),
  and the message latency, the all-reduce's fixed cost and the costs per action fitted to
  alternating runs of the default and data-parallel plans (:mod:`.calibration_runs`; the
  compute per action from the data-parallel plan at two micro-batch sizes,
  :mod:`.calibration_sizes`; round by round, each plan at its own measured compute speed,
  the median kept, :mod:`.calibration_rounds`; solved by :mod:`.calibration_solve`);
* a plan trained for a few steps and timed (:mod:`.plan_run`), plans timed in alternating
  rounds (:mod:`.alternating`), and ``pipeweave auto --run``'s comparison (:mod:`.compare`);
* pilots: the finalists of ``auto --semantics any`` trained briefly in one process and ranked
  by predicted time to a target loss (:mod:`.pilot`);
* the AvgPipe tuner's sources: short real runs of a setting (:mod:`.tune_runs`) and a built-in
  model simulated from costs profiled here (:mod:`.tune_model`), and the tuner's profile from
  either (:mod:`.tune_profile`);
* a built-in model profiled as the local ranks see it (:mod:`.profiles`).

Every public function takes its options by keyword. The CLI parses arguments and calls these;
nothing here reads an ``argparse.Namespace``.
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .alternating import RUN_ROUNDS, TIMED_SECONDS, Rounds, alternate, round_steps, timed_steps
    from .calibration import calibrate, calibration_skipped
    from .calibration_runs import CalibrationFit, calibration_plans, fit_calibration
    from .compare import compare_predictions, measure_alongside, measure_predictions
    from .pilot import check_pilot, pilot_finalists, pilot_plan
    from .plan_run import (Measured, check_steps, measure_plan, measure_prediction, peak_memory,
                           plan_job, plan_timer)
    from .profiles import (DEFAULT_MICROBATCH, auto_microbatch_sizes, local_shared_cores,
                           profile_model, profile_sizes)
    from .runtime_costs import fit_runtime_costs, measure_runtime_costs
    from .tune_model import LOOPBACK_BANDWIDTH, builtin_model, profile_cache
    from .tune_profile import SOURCES, UTILISATIONS, tuning_profile, tuning_sizes
    from .tune_runs import RealRun, profile_real_run, run_setting

_HOMES = {
    "alternating": ("RUN_ROUNDS", "TIMED_SECONDS", "Rounds", "alternate", "round_steps",
                    "timed_steps"),
    "calibration": ("calibrate", "calibration_skipped"),
    "calibration_runs": ("CalibrationFit", "calibration_plans", "fit_calibration"),
    "compare": ("compare_predictions", "measure_alongside", "measure_predictions"),
    "pilot": ("check_pilot", "pilot_finalists", "pilot_plan"),
    "plan_run": ("Measured", "check_steps", "measure_plan", "measure_prediction", "peak_memory",
                 "plan_job", "plan_timer"),
    "profiles": ("DEFAULT_MICROBATCH", "auto_microbatch_sizes", "local_shared_cores",
                 "profile_model", "profile_sizes"),
    "runtime_costs": ("fit_runtime_costs", "measure_runtime_costs"),
    "tune_model": ("LOOPBACK_BANDWIDTH", "builtin_model", "profile_cache"),
    "tune_profile": ("SOURCES", "UTILISATIONS", "tuning_profile", "tuning_sizes"),
    "tune_runs": ("RealRun", "profile_real_run", "run_setting"),
}
"""Which submodule defines each public name; the names load on first use
(:func:`pipeweave.lazy.lazy_names`), so importing this package, or a torch-free module of it
(``alternating``), imports no torch."""

__getattr__ = lazy_names(__name__, {name: home for home, names in _HOMES.items()
                                    for name in names})

__all__ = ["Rounds", "alternate", "round_steps", "CalibrationFit", "calibration_plans",
           "fit_calibration", "RUN_ROUNDS", "compare_predictions",
           "measure_alongside", "measure_predictions", "peak_memory", "plan_timer", "calibrate",
           "calibration_skipped", "fit_runtime_costs", "measure_runtime_costs",
           "TIMED_SECONDS", "timed_steps", "Measured", "check_steps", "measure_plan",
           "measure_prediction", "plan_job", "check_pilot", "pilot_plan", "pilot_finalists",
           "DEFAULT_MICROBATCH", "auto_microbatch_sizes", "profile_sizes",
           "local_shared_cores", "profile_model", "LOOPBACK_BANDWIDTH", "builtin_model",
           "profile_cache", "SOURCES", "UTILISATIONS", "tuning_profile", "tuning_sizes",
           "RealRun", "profile_real_run", "run_setting"]
