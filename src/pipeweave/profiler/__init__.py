"""Profiler: per-block costs of a model (measured with stock PyTorch, or imported from
PipeDream's ``graph.txt``) and the point-to-point link between two local ranks, as a JSON
:class:`Profile` the planners read."""

from .link import fit_link, measure_link
from .measure import profile_block, profile_builtin, profile_model
from .pipedream_graph import parse_pipedream_graph, read_pipedream_graph
from .profile import SCHEMA, BlockProfile, LinkProfile, Profile

__all__ = ["SCHEMA", "BlockProfile", "LinkProfile", "Profile", "profile_model", "profile_block",
           "profile_builtin", "measure_link", "fit_link", "parse_pipedream_graph",
           "read_pipedream_graph"]
