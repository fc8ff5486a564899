"""``--model NAME`` and ``--hf-config FILE``: which registered model a command builds.

``--hf-config`` takes a transformers ``config.json`` of a family ``pipeweave.hf`` adapts; the
model is then ``hf-<model_type>`` built from that config with random weights (``--model`` may
be left out, or must name that same family).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["HF_CONFIG_HELP", "add_hf_config", "chosen_model"]

HF_CONFIG_HELP = ("a Hugging Face config.json (gpt2, llama, qwen2 or mistral) to build the "
                  "model from, with random weights; implies --model hf-<its model_type>")


def add_hf_config(parser: Any) -> None:
    """Add ``--hf-config FILE`` to a parser or argument group."""
    parser.add_argument("--hf-config", type=Path, default=None, metavar="FILE.json",
                        help=HF_CONFIG_HELP)


def chosen_model(args: argparse.Namespace, *, default: str | None = None
                 ) -> tuple[str | None, dict[str, Any]]:
    """``(name, build_model overrides)`` from ``--model`` and ``--hf-config``; ``--seq-len``,
    where the command has it, is left to the caller."""
    model: str | None = args.model
    path: Path | None = getattr(args, "hf_config", None)
    if path is None:
        return (model if model is not None else default), {}
    if not path.is_file():
        raise ValueError(f"--hf-config {path}: no such file; give the path of a transformers "
                         f"config.json")
    from ..hf.presets import config_family

    name = f"hf-{config_family(path)}"
    if model is not None and model != name:
        raise ValueError(f"--hf-config {path} is a {name.removeprefix('hf-')} config but --model "
                         f"is {model}; drop --model or use --model {name}")
    return name, {"config_file": str(path)}
