"""The memory model: what a rank holds, by kind, read off a schedule and per-stage bytes.

One model for every estimate (torch-free, below the simulator so that all its callers can
import it): the planner's prediction from a profile (``planner.memory``), ``auto``'s bounds and
search, ``train --memory-limit`` from the model's shapes (``runtime.observation.memory``),
the simulator's held activations and weight versions (``sim.metrics``) and AvgPipe's model
bytes (``avgpipe.simulated``).

* :mod:`.optimizers`: optimizer state per parameter, per ``torch.optim`` optimizer;
* :mod:`.versions`: weight versions and copies, from the schedule's version tags;
* :mod:`.held`: activations in flight, from the schedule (:mod:`.held_counts`: counted once
  per schedule, weighed per partition);
* :mod:`.timeline`: the moment of a rank's peak (gradients, activations, recomputation,
  split backwards, messages in flight, workspace); :mod:`.lowered_columns` and
  :mod:`.walk_columns`: the same, read off a flush schedule's numpy columns;
* :mod:`.model`: the parts put together per rank (``N`` pipelines, AvgPipe's reference model).
"""

from .held import held_activations
from .model import (ModelState, RankMemory, Sharding, StageWeights, model_state, rank_memory,
                    stage_state)
from .optimizers import (OPTIMIZER_STATE, check_optimizer, optimizer_key,
                         optimizer_state_bytes)
from .timeline import PeakMoment, StageBytes, peak_moments, peak_moments_of
from .versions import weight_copies, weight_versions

__all__ = ["held_activations", "ModelState", "RankMemory", "Sharding", "StageWeights",
           "model_state", "rank_memory", "stage_state", "OPTIMIZER_STATE", "check_optimizer", "optimizer_key",
           "optimizer_state_bytes", "PeakMoment", "StageBytes", "peak_moments",
           "peak_moments_of", "weight_copies", "weight_versions"]
