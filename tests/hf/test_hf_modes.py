"""Train mode whatever mode a model comes in: a ``from_pretrained`` model (eval mode) trains
with its dropout on, the same in the single-process and the distributed executor."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from torch import nn

pytest.importorskip("transformers")

from pipeweave.runtime import Job, launch_local, run_local  # noqa: E402
from pipeweave.testing import assert_identical_runs, iteration_losses  # noqa: E402

from hf_jobs import PretrainedFactory, hf_job, hf_model  # noqa: E402

DROPOUT = 0.2


def _pretrained_job(tmp_path: Path) -> Job:
    """Three steps of GPT-2 (dropout 0.2) on two ranks, loaded back with ``from_pretrained``."""
    hf_model("gpt2", resid_pdrop=DROPOUT, embd_pdrop=DROPOUT,
             attn_pdrop=DROPOUT).save_pretrained(tmp_path)
    loaded = PretrainedFactory(str(tmp_path))()
    dropouts = [m for b in loaded.blocks for m in b.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and not any(m.training for m in dropouts)  # they come in eval mode
    return dataclasses.replace(hf_job("gpt2", sublayer=False),
                               model=PretrainedFactory(str(tmp_path)))


def test_an_eval_mode_model_trains_with_its_dropout(tmp_path: Path) -> None:
    job = _pretrained_job(tmp_path)
    losses = iteration_losses(run_local(job), job.plan.microbatches)
    without = dataclasses.replace(job, model=PretrainedFactory(str(tmp_path), dropout=0.0))
    no_dropout = iteration_losses(run_local(without), job.plan.microbatches)
    assert all(a != b for a, b in zip(losses, no_dropout)), (losses, no_dropout)


def test_the_run_leaves_the_models_own_modes() -> None:
    """The checks before launch run the model in eval mode and give it back as it came."""
    from pipeweave.runtime.launch.prepare import prepare

    job = hf_job("gpt2", sublayer=False)
    spec = job.model()
    spec.blocks[1].layer.eval()  # HF's layer in eval mode, its wrapper not: from_pretrained's
    spec.blocks[2].eval()        # model through blocks(); and a whole block in eval mode
    before = [m.training for block in spec.blocks for m in block.modules()]
    prepare(job, spec=spec)
    assert [m.training for block in spec.blocks for m in block.modules()] == before


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_both_executors_train_an_eval_mode_model_alike(tmp_path: Path) -> None:
    job = _pretrained_job(tmp_path)
    assert_identical_runs(launch_local(job, deadline_s=240), run_local(job))
