"""The measuring profiler on small models: sizes exact, times positive, threads restored."""

from __future__ import annotations

import torch
from torch import nn

from pipeweave.models import ModelSpec
from pipeweave.profiler.measure import profile_builtin, profile_model


def mlp() -> ModelSpec:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(8, 16), nn.ReLU()), nn.Linear(16, 3)]
    return ModelSpec.from_blocks(blocks, nn.functional.cross_entropy, name="toy",
                                 block_names=["fc", "head"])


def test_sizes_of_a_two_block_mlp() -> None:
    inputs, targets = torch.randn(5, 8), torch.tensor([0, 1, 2, 0, 1])
    profile = profile_model(mlp(), inputs, targets, warmup=1, repeats=3, optimizer="adam", threads=1)
    fc, head = profile.blocks
    assert [fc.name, head.name] == ["fc", "head"] and profile.batch_size == 5
    assert fc.output_bytes == 5 * 16 * 4 and head.output_bytes == 5 * 3 * 4
    assert fc.parameter_bytes == (8 * 16 + 16) * 4 and head.parameter_bytes == (16 * 3 + 3) * 4
    # Adam keeps exp_avg and exp_avg_sq (2 x parameters) and a float32 step count per tensor
    assert fc.optimizer_bytes == 2 * fc.parameter_bytes + 2 * 4
    # fc saves its input and the ReLU output for backward; head saves its input, and the loss
    # (counted in the last block) saves the log-softmax of the logits
    assert fc.activation_bytes >= 5 * 8 * 4 + 5 * 16 * 4
    assert head.activation_bytes >= 5 * 16 * 4 + 5 * 3 * 4
    assert all(b.forward > 0 and b.backward > 0 and b.update > 0 for b in profile.blocks)
    assert all(0 < b.weight_grad and 0 < b.input_grad for b in profile.blocks)  # I, W timed
    assert profile.input_bytes == 5 * 8 * 4 and profile.source == "measured"
    assert profile.metadata["statistic"] == "median" and profile.metadata["repeats"] == 3


def test_memory_sizes_of_a_two_block_mlp() -> None:
    inputs, targets = torch.randn(5, 8), torch.tensor([0, 1, 2, 0, 1])
    fc, head = profile_model(mlp(), inputs, targets, warmup=0, repeats=1, threads=1).blocks
    # the Linear saves its input (5x8) and its weight; the ReLU its output (5x16). The weight
    # is the block's own parameter, held once whatever the micro-batches: not counted.
    assert fc.activation_bytes == 5 * 8 * 4 + 5 * 16 * 4
    # a split backward keeps the gradient of each parameter holder's output from I to W, and
    # that output itself from the forward where autograd does not save it (the ReLU saves its
    # own result, the loss's log-softmax its own): the Linear outputs, 5x16 and 5x3 floats
    assert (fc.pending_bytes, fc.recorded_bytes) == (5 * 16 * 4, 5 * 16 * 4)
    assert (head.pending_bytes, head.recorded_bytes) == (5 * 3 * 4, 5 * 3 * 4)
    # measured at the CPU allocator: at least what the block keeps plus its weight gradients
    for block in (fc, head):
        assert block.peak_memory_bytes >= block.activation_bytes + block.parameter_bytes


def test_threads_are_restored_and_sgd_state() -> None:
    before = torch.get_num_threads()
    profile = profile_model(mlp(), torch.randn(4, 8), None, warmup=0, repeats=1, optimizer="sgd",
                            threads=1)
    assert torch.get_num_threads() == before
    # SGD with momentum: one momentum buffer per parameter
    assert [b.optimizer_bytes for b in profile.blocks] == [b.parameter_bytes for b in profile.blocks]


def test_builtin_gpt_profile_has_sublayer_blocks() -> None:
    profile = profile_builtin("gpt-tiny", batch_size=2, warmup=0, repeats=1, threads=1)
    names = [b.name for b in profile.blocks]
    assert names[:3] == ["embed", "layer0.attn", "layer0.ffn"] and names[-1] == "head"
    assert profile.num_blocks == 10 and profile.model == "gpt-tiny"
    d, t = 64, 64
    assert profile.blocks[1].output_bytes == 2 * t * d * 4  # [B, T, d] float32
    assert profile.blocks[-1].output_bytes == 2 * t * 256 * 4  # logits [B, T, V]
    ffn = profile.blocks[2]
    assert ffn.parameter_bytes == (2 * d + d * 256 + 256 + 256 * d + d) * 4


def test_a_block_without_parameters_has_no_weight_gradient_time() -> None:
    blocks = [nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)]
    spec = ModelSpec.from_blocks(blocks, nn.functional.cross_entropy, name="toy",
                                 block_names=["fc", "tanh", "head"])
    profile = profile_model(spec, torch.randn(4, 8), torch.tensor([0, 1, 2, 0]), warmup=0,
                            repeats=1, optimizer="sgd", threads=1)
    assert [b.weight_grad > 0 for b in profile.blocks] == [True, False, True]
