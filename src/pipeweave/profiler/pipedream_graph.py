"""Import PipeDream's profile format (``graph.txt``) as a pipeweave :class:`Profile`.

PipeDream's profiler writes one line per operator, then tab-indented edges::

    node4 -- Conv2d(64, 64, ...) -- forward_compute_time=46.201, backward_compute_time=113.330, activation_size=1644167168.000, parameter_size=147712.000
    	node3 -- node4

Times are milliseconds per minibatch; sizes are bytes (``activation_size`` may be a list
``[a; b; c]`` for several outputs, summed here).

pipeweave's blocks form a chain (one tensor in, one tensor out), while PipeDream's graphs may
branch (ResNet's skip connections, Inception's towers, VGG's ``Size`` side-branch). PipeDream
partitions over *antichains*: a stage boundary is a downset of the graph and everything its
frontier sends crosses the boundary (pipedream.txt §3.1 and the optimizer's antichain DAG).
We keep exactly the boundaries where that frontier is a single node ``v``:

* every node is an ancestor of ``v``, ``v`` itself or a descendant of ``v``, and
* every edge leaving ``{v} ∪ ancestors(v)`` starts at ``v``,

so cutting after ``v`` sends one tensor, ``v``'s output. Those *cut points*, in topological
order, collapse the graph to an ordered list of blocks (the nodes between consecutive cut
points)::

    VGG-16 tail:   node32 ──► node33 (Size) ──► node34 (View) ──► node35 ...
                      └──────────────────────────►┘
    cut points:    node32, node34, node35, ...   (not node33: node32's edge to node34 crosses)
    blocks:        [..., node32], [node33, node34], [node35], ...

A chain keeps one block per node; a residual network gets one block per residual unit.
Before that, as PipeDream's optimizer does, ``Input*`` sources (whose time is data loading)
are dropped and unused ``__getitem__`` sinks are removed. A graph that still has several
sources, or that has no cut point at all (GNMT's decoder reads the encoder's hidden states
and a second input everywhere), is refused with a message naming the offending nodes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .profile import BlockProfile, Profile

__all__ = ["GraphNode", "parse_pipedream_graph", "read_pipedream_graph", "cut_points"]

_NODE = re.compile(
    r"^(?P<id>\S+) -- (?P<desc>.*) -- forward_compute_time=(?P<fwd>[^,]+), "
    r"backward_compute_time=(?P<bwd>[^,]+), activation_size=(?P<act>.+), "
    r"parameter_size=(?P<par>[^,\s]+)\s*$"
)
_EDGE = re.compile(r"^\s+(?P<src>\S+) -- (?P<dst>\S+)\s*$")


@dataclass(frozen=True)
class GraphNode:
    """One operator of a PipeDream profile (times in milliseconds, sizes in bytes)."""

    node_id: str
    description: str
    forward_ms: float
    backward_ms: float
    activation_bytes: float
    parameter_bytes: float


def read_pipedream_graph(path: str | Path) -> Profile:
    """Read a ``graph.txt`` file (see the module docstring)."""
    from ..files import read_text

    path = Path(path)
    text = read_text(path, what=f"PipeDream graph {path}",
                     fix="give the graph.txt that PipeDream's profiler wrote")
    return parse_pipedream_graph(text, name=path.parent.name if path.stem == "graph"
                                 else path.stem)


def parse_pipedream_graph(text: str, *, name: str = "pipedream") -> Profile:
    """Parse ``graph.txt`` text and collapse it to an ordered block list."""
    nodes, edges = _parse(text, name)
    nodes, edges, dropped = _drop_inputs_and_unused_outputs(nodes, edges)
    order = _topological_order(nodes, edges, name)
    sources = [n for n in order if not any(dst == n for _, dst in edges)]
    if len(sources) != 1:
        raise ValueError(
            f"PipeDream graph {name!r} has {len(sources)} sources after dropping Input nodes "
            f"({', '.join(f'{s} ({nodes[s].description[:40]})' for s in sources)}); pipeweave's "
            "blocks take one input tensor, so this graph cannot be collapsed to a chain of blocks"
        )
    cuts = cut_points(order, edges)
    if not cuts or (len(cuts) == 1 and cuts[0] == order[-1] and len(order) > 1):
        raise ValueError(
            f"PipeDream graph {name!r} has no cut point where a single tensor crosses (every "
            "boundary would send several tensors); it cannot be collapsed to a chain of blocks"
        )
    blocks = _blocks(order, cuts, nodes)
    input_ms = sum(n.forward_ms for n in dropped)
    return Profile(
        blocks=tuple(blocks), model=name, batch_size=None, device="pipedream-profile",
        source="pipedream-graph", input_bytes=sum(n.activation_bytes for n in dropped),
        metadata={"nodes": len(nodes), "dropped_nodes": [n.node_id for n in dropped],
                  "data_loading_seconds": input_ms / 1000.0,
                  "time_unit_in_file": "ms (converted to s)"},
    )


def cut_points(order: list[str], edges: Iterable[tuple[str, str]]) -> list[str]:
    """Nodes after which exactly one tensor crosses (module docstring), in ``order``."""
    position = {node: i for i, node in enumerate(order)}
    successors: dict[str, list[str]] = {node: [] for node in order}
    for src, dst in edges:
        successors[src].append(dst)
    # Ancestor and descendant sets as bit masks over topological positions.
    ancestors = [0] * len(order)
    for i, node in enumerate(order):
        for dst in successors[node]:
            ancestors[position[dst]] |= ancestors[i] | (1 << i)
    descendants = [0] * len(order)
    for i in range(len(order) - 1, -1, -1):
        for dst in successors[order[i]]:
            j = position[dst]
            descendants[i] |= descendants[j] | (1 << j)
    everything = (1 << len(order)) - 1
    successor_mask = [sum(1 << position[dst] for dst in successors[node]) for node in order]
    cuts = []
    for i, node in enumerate(order):
        downset = ancestors[i] | (1 << i)
        if downset | descendants[i] != everything:
            continue  # some node is unrelated to this one: it would have to cross too
        outside = everything & ~downset
        if not any(successor_mask[j] & outside for j in _bits(ancestors[i])):
            cuts.append(node)
    return cuts


def _bits(mask: int) -> list[int]:
    """Positions of the set bits of ``mask``."""
    out, index = [], 0
    while mask:
        if mask & 1:
            out.append(index)
        mask >>= 1
        index += 1
    return out


def _blocks(order: list[str], cuts: list[str], nodes: dict[str, GraphNode]) -> list[BlockProfile]:
    blocks, current = [], []
    cut_set = set(cuts)
    for node in order:
        current.append(nodes[node])
        if node in cut_set or node == order[-1]:
            last = current[-1]
            label = last.description.split("(")[0].strip() or "op"
            blocks.append(BlockProfile(
                name=f"{last.node_id}:{label}",
                forward=sum(n.forward_ms for n in current) / 1000.0,
                backward=sum(n.backward_ms for n in current) / 1000.0,
                output_bytes=last.activation_bytes,
                activation_bytes=sum(n.activation_bytes for n in current),
                parameter_bytes=sum(n.parameter_bytes for n in current),
            ))
            current = []
    return blocks


def _parse(text: str, name: str) -> tuple[dict[str, GraphNode], list[tuple[str, str]]]:
    nodes: dict[str, GraphNode] = {}
    edges: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        edge = _EDGE.match(line) if line[0].isspace() else None
        if edge is not None:
            edges.append((edge["src"], edge["dst"]))
            continue
        match = _NODE.match(line)
        if match is None:
            raise ValueError(
                f"PipeDream graph {name!r} line {number} is neither a node line 'nodeN -- "
                "<description> -- forward_compute_time=<ms>, backward_compute_time=<ms>, "
                "activation_size=<bytes>, parameter_size=<bytes>' nor a tab-indented edge "
                f"'nodeA -- nodeB': {line[:120]!r}"
            )
        node_id = match["id"]
        if node_id in nodes:
            raise ValueError(f"PipeDream graph {name!r} line {number}: node {node_id} is defined twice")
        try:
            nodes[node_id] = GraphNode(
                node_id, match["desc"].strip(), float(match["fwd"]), float(match["bwd"]),
                sum(float(x) for x in match["act"].strip().strip("[]").split(";")),
                float(match["par"]),
            )
        except ValueError:
            raise ValueError(f"PipeDream graph {name!r} line {number}: a number does not parse: "
                             f"{line[:120]!r}") from None
    if not nodes:
        raise ValueError(f"PipeDream graph {name!r} has no node lines")
    for src, dst in edges:
        for end in (src, dst):
            if end not in nodes:
                raise ValueError(f"PipeDream graph {name!r}: edge {src} -- {dst} names unknown "
                                 f"node {end}")
    return nodes, edges


def _drop_inputs_and_unused_outputs(
    nodes: dict[str, GraphNode], edges: list[tuple[str, str]]
) -> tuple[dict[str, GraphNode], list[tuple[str, str]], list[GraphNode]]:
    """PipeDream's optimizer drops ``Input*`` sources and unused ``__getitem__`` sinks."""
    nodes = dict(nodes)
    has_input = {dst for _, dst in edges}
    dropped = [n for key, n in nodes.items()
               if n.description.startswith("Input") and key not in has_input]
    removed = {n.node_id for n in dropped}
    while True:
        live = [(s, d) for s, d in edges if s not in removed and d not in removed]
        has_output = {src for src, _ in live}
        sinks = {key for key, n in nodes.items() if key not in removed and key not in has_output
                 and n.description.startswith("__getitem__")}
        if not sinks:
            break
        removed |= sinks
    for key in removed:
        del nodes[key]
    edges = [(s, d) for s, d in edges if s not in removed and d not in removed]
    return nodes, edges, dropped


def _topological_order(nodes: dict[str, GraphNode], edges: list[tuple[str, str]],
                       name: str) -> list[str]:
    """Kahn's algorithm; ties broken by the node's number (then its name) for determinism."""
    indegree = {key: 0 for key in nodes}
    successors: dict[str, list[str]] = {key: [] for key in nodes}
    for src, dst in edges:
        indegree[dst] += 1
        successors[src].append(dst)

    def key(node: str) -> tuple[int, str]:
        digits = re.sub(r"\D", "", node)
        return (int(digits) if digits else 0, node)

    ready = sorted((n for n, d in indegree.items() if d == 0), key=key)
    order: list[str] = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for dst in successors[node]:
            indegree[dst] -= 1
            if indegree[dst] == 0:
                ready.append(dst)
        ready.sort(key=key)
    if len(order) != len(nodes):
        cyclic = sorted(n for n, d in indegree.items() if d > 0)
        raise ValueError(f"PipeDream graph {name!r} has a cycle through {cyclic[:6]}")
    return order
