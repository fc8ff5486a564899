"""What ``pipeweave train`` writes to its output folder: per-step metrics (JSON Lines, CSV,
TensorBoard on request), ``summary.json``, ``plan.json``, the measured Chrome trace and the
loss plot; for a completed run and for the completed steps of a failed one alike."""

from __future__ import annotations

import json
from pathlib import Path

from ..runtime import Job
from ..runtime.observation.summary import TrainSummary
from ..runtime.observation.results import RankResult
from . import train_avgpipe

__all__ = ["write_outputs"]


def write_outputs(directory: Path, job: Job, summary: TrainSummary,
                  results: list[RankResult], *, tensorboard: bool = False) -> None:
    from ..report.chrome_trace import write_chrome_trace
    from ..report.loss_plot import plot_losses
    from ..report.metrics_io import write_metrics, write_tensorboard

    directory.mkdir(parents=True, exist_ok=True)
    rows = [
        {"step": k + 1, "loss": loss, "time_s": summary.iteration_end_s[k],
         "samples": (k + 1) * summary.batch_size}
        for k, loss in enumerate(summary.losses)
    ]
    for row in rows[:summary.first_step]:  # restored from a checkpoint: not timed by this run
        del row["time_s"]
    for step, eval_loss in summary.eval_losses.items():
        rows[step - 1]["eval_loss"] = eval_loss
    train_avgpipe.add_metrics(rows, summary)
    write_metrics(rows, directory)
    if tensorboard:
        write_tensorboard(rows, directory / "tensorboard")
    (directory / "summary.json").write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    job.plan.save(directory / "plan.json")
    records = sorted((r for result in results for r in result.records), key=lambda r: (r[0], r[2]))
    write_chrome_trace(records, directory / "trace.json", name=f"measured {job.plan.schedule}")
    plot_losses({job.plan.schedule: summary.losses}, directory / "loss.png")
