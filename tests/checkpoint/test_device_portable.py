"""A checkpoint written on one device resumes on another (docs/gpu.md): shards are read onto
the host (``map_location="cpu"``) and copied into the stages wherever the resumed run puts
them; optimizer state follows its parameters (torch's ``Optimizer.load_state_dict``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.serialization

from pipeweave.runtime import run_local
from pipeweave.runtime.checkpoint.store import complete_checkpoints

from checkpoint_jobs import assert_same_run, gpt_job, with_checkpoints
from test_resume import _resumed


def test_shards_written_on_a_gpu_resume_on_the_cpu(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    job = gpt_job(depth=2, steps=4, optimizer="adam")
    straight = run_local(job)
    with monkeypatch.context() as gpu:  # every storage saved as a GPU's would be
        gpu.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        run_local(with_checkpoints(job, directory=str(tmp_path), every=2))
    after2 = complete_checkpoints(tmp_path)[0]
    if not torch.cuda.is_available():  # what a load without map_location does on a CPU
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(next(after2.glob("rank*.pt")), weights_only=True)
    seen: list[Any] = []
    load = torch.load

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("map_location"))
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording)
    assert_same_run(_resumed(job, after2), straight, microbatches=4, steps=[3, 4])
    assert seen and set(seen) == {"cpu"}
