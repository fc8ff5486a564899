"""``pipeweave auto``'s engine: search schedule, partition, M, N, depth x width, chunks,
recomputation and APC by simulation under a memory limit (docs/auto.md).

``search(AutoProblem(profile, ranks, ...))`` enumerates the candidates of the pluggable axes
(:mod:`.axes`), prunes with lower bounds from the profile (:mod:`.bounds`), simulates the
survivors (:mod:`.predict`) and ranks them by predicted samples/s; a candidate predicted above
the memory limit is never chosen. No torch here: the planner layer.
"""

from .axes import DEFAULT_AXES, Axis, enumerate_candidates
from .pareto import pareto_front, plot_pareto
from .predict import Prediction, predict
from .problem import SEMANTICS, AutoProblem, Candidate
from .search import SearchResult, default_candidate, search

__all__ = ["AutoProblem", "Candidate", "SEMANTICS", "Axis", "DEFAULT_AXES",
           "enumerate_candidates", "Prediction", "predict", "SearchResult", "search",
           "default_candidate", "pareto_front", "plot_pareto"]
