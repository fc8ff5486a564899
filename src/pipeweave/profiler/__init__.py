"""Profiler: per-block costs of a model (measured with stock PyTorch, or imported from
PipeDream's ``graph.txt``) and the point-to-point link between two local ranks, as a JSON
:class:`Profile` the planners read.

The package surface is the data (importable without torch, as the planner needs it); the
measurements live in :mod:`.measure` (``profile_model``, ``profile_block``,
``profile_builtin``) and :mod:`.link` (``measure_link``, ``fit_link``)."""

from .pipedream_graph import parse_pipedream_graph, read_pipedream_graph
from .profile import SCHEMA, BlockProfile, LinkProfile, Profile, TieProfile

__all__ = ["SCHEMA", "BlockProfile", "LinkProfile", "Profile", "TieProfile",
           "parse_pipedream_graph",
           "read_pipedream_graph"]
