"""Measurement on this machine, between the runtime and the CLI: what the commands and the
benchmarks run for real to learn a number.

* calibration: a profile completed with the link and the runtime's costs per action
  (:mod:`.calibration`, :mod:`.runtime_costs`) and the message latency fitted to one run of
  the default plan (:mod:`.message_latency`);
* a plan trained for a few steps and timed (:mod:`.plan_run`, ``pipeweave auto --run``);
* pilots: the finalists of ``auto --semantics any`` trained briefly in one process and ranked
  by predicted time to a target loss (:mod:`.pilot`);
* the AvgPipe tuner's sources: short real runs of a setting (:mod:`.tune_runs`) and a built-in
  model simulated from costs profiled here (:mod:`.tune_model`), and the tuner's profile from
  either (:mod:`.tune_profile`);
* a built-in model profiled as the local ranks see it (:mod:`.profiles`).

Every public function takes its options by keyword. The CLI parses arguments and calls these;
nothing here reads an ``argparse.Namespace``.
"""

from .calibration import calibrate, calibration_skipped
from .message_latency import (TIMED_SECONDS, MessageFit, default_plan_time, fit_message_latency,
                              timed_steps, with_message_latency)
from .pilot import check_pilot, pilot_finalists, pilot_plan
from .plan_run import Measured, check_steps, measure_plan, measure_prediction, plan_job
from .profiles import DEFAULT_MICROBATCH, auto_microbatch_sizes, local_shared_cores, profile_model
from .runtime_costs import fit_runtime_costs, measure_runtime_costs
from .tune_model import LOOPBACK_BANDWIDTH, builtin_model, profile_cache
from .tune_profile import SOURCES, UTILISATIONS, tuning_profile
from .tune_runs import RealRun, profile_real_run, run_setting

__all__ = ["calibrate", "calibration_skipped", "fit_runtime_costs", "measure_runtime_costs",
           "TIMED_SECONDS", "MessageFit", "default_plan_time", "fit_message_latency",
           "timed_steps", "with_message_latency", "Measured", "check_steps", "measure_plan",
           "measure_prediction", "plan_job", "check_pilot", "pilot_plan", "pilot_finalists",
           "DEFAULT_MICROBATCH", "auto_microbatch_sizes",
           "local_shared_cores", "profile_model", "LOOPBACK_BANDWIDTH", "builtin_model",
           "profile_cache", "SOURCES", "UTILISATIONS", "tuning_profile", "RealRun",
           "profile_real_run", "run_setting"]
