"""PipeDream's graph.txt: parsing, Input/unused-output removal, and collapsing to cut points."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeweave.profiler import Profile, parse_pipedream_graph, read_pipedream_graph
from pipeweave.profiler.pipedream_graph import cut_points

PROFILES = Path("/work/shared/reference/pipedream-profiles")
needs_profiles = pytest.mark.skipif(not PROFILES.exists(), reason="reference profiles not present")


def line(node: str, desc: str, fwd: float, bwd: float, act: str, par: float) -> str:
    return (f"{node} -- {desc} -- forward_compute_time={fwd}, backward_compute_time={bwd}, "
            f"activation_size={act}, parameter_size={par}")


# A residual unit: node2 -> node3 -> node4 -> Add(node5) <- node2, then node6 -> node7.
RESIDUAL = "\n".join([
    line("node1", "Input", 9.0, 0.0, "100.0", 0.0),
    line("node2", "Conv2d(a)", 1.0, 2.0, "10.0", 4.0),
    line("node3", "ReLU", 0.5, 0.5, "10.0", 0.0),
    line("node4", "Conv2d(b)", 1.0, 2.0, "10.0", 8.0),
    line("node5", "Add", 0.0, 0.0, "10.0", 0.0),
    line("node6", "Linear(c)", 2.0, 3.0, "[3.0; 1.0]", 16.0),
    line("node7", "__getitem__(1)", 0.0, 0.0, "1.0", 0.0),
    line("node8", "__getitem__(0)", 0.0, 0.0, "3.0", 0.0),
    line("node9", "Softmax", 0.25, 0.25, "3.0", 0.0),
    "\tnode1 -- node2", "\tnode2 -- node3", "\tnode3 -- node4", "\tnode4 -- node5",
    "\tnode2 -- node5", "\tnode5 -- node6", "\tnode6 -- node7", "\tnode6 -- node8",
    "\tnode8 -- node9",
])


def test_residual_unit_collapses_to_its_cut_points() -> None:
    profile = parse_pipedream_graph(RESIDUAL, name="toy")
    # Input dropped (its 9 ms is data loading), unused __getitem__(1) dropped; node3/node4 are
    # inside the residual unit (node2's skip edge crosses them), so blocks end at 2, 5, 6, 8, 9.
    assert [b.name for b in profile.blocks] == [
        "node2:Conv2d", "node5:Add", "node6:Linear", "node8:__getitem__", "node9:Softmax"]
    unit = profile.blocks[1]
    assert (unit.forward, unit.backward) == (0.0015, 0.0025)  # ms -> s, nodes 3, 4, 5 summed
    assert unit.output_bytes == 10.0 and unit.activation_bytes == 30.0 and unit.parameter_bytes == 8.0
    assert profile.blocks[2].output_bytes == 4.0  # "[3.0; 1.0]" sums the outputs
    assert profile.metadata["dropped_nodes"] == ["node1"]
    assert profile.metadata["data_loading_seconds"] == 0.009
    assert profile.source == "pipedream-graph" and profile.input_bytes == 100.0


def test_cut_points_of_a_diamond() -> None:
    order = ["a", "b", "c", "d", "e"]
    edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")]
    assert cut_points(order, edges) == ["a", "d", "e"]


@needs_profiles
def test_vgg16_is_a_chain_except_the_size_branch() -> None:
    profile = read_pipedream_graph(PROFILES / "vgg16.txt")
    assert profile.model == "vgg16" and profile.num_blocks == 39  # 41 nodes - Input - Size
    names = [b.name for b in profile.blocks]
    # node32 (MaxPool) feeds both Size (node33) and View (node34): node33 is no cut point
    assert names[29:33] == ["node31:ReLU", "node32:MaxPool2d", "node34:View", "node35:Linear"]
    assert profile.blocks[31].activation_bytes == 4.0 + 12845056.0  # Size + View outputs
    text = (PROFILES / "vgg16.txt").read_text()
    total_ms = sum(float(part.split("=")[1]) for row in text.splitlines() if not row.startswith("\t")
                   for part in row.split(" -- ")[2].split(", ")[:2] if "Input" not in row)
    assert sum(profile.compute) == pytest.approx(total_ms / 1000)
    assert sum(profile.parameter_bytes) == pytest.approx(553_430_440.0)  # 138.36 M parameters
    assert profile.blocks[-1].name == "node41:Linear" and profile.blocks[-1].output_bytes == 512000.0


@needs_profiles
def test_branchy_profiles() -> None:
    alexnet = read_pipedream_graph(PROFILES / "alexnet.txt")
    assert alexnet.num_blocks == 21
    resnet = read_pipedream_graph(PROFILES / "resnet18.txt")
    # stem (conv, bn, relu, maxpool), then 8 residual units of 2 blocks (Add, ReLU), then head
    assert resnet.num_blocks == 4 + 8 * 2 + 3
    assert [b.name.split(":")[1] for b in resnet.blocks[4:8]] == ["Add", "ReLU", "Add", "ReLU"]


@needs_profiles
def test_graphs_with_several_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"'gnmt' has 3 sources after dropping Input nodes .*node20 "
                                         r"\(hidden\).*cannot be collapsed to a chain"):
        Profile.load(PROFILES / "gnmt.txt")


def test_malformed_graphs() -> None:
    with pytest.raises(ValueError, match="line 1 is neither a node line"):
        parse_pipedream_graph("node1 -- Conv2d -- forward=1\n")
    with pytest.raises(ValueError, match="edge node1 -- node9 names unknown node node9"):
        parse_pipedream_graph(line("node1", "Conv", 1, 1, "1", 1) + "\n\tnode1 -- node9\n")
    cyclic = "\n".join([line("node1", "A", 1, 1, "1", 1), line("node2", "B", 1, 1, "1", 1),
                        "\tnode1 -- node2", "\tnode2 -- node1"])
    with pytest.raises(ValueError, match="has a cycle"):
        parse_pipedream_graph(cyclic)
