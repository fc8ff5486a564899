"""``pipeweave export``: a checkpoint's trained weights as a folder other tools load.

    pipeweave export --checkpoint runs/latest --out exported/
    python -c "from transformers import AutoModelForCausalLM as M; M.from_pretrained('exported')"

HF models (``--model hf-*``, ``--hf-config``, ``--hf-pretrained``) become a folder
``from_pretrained`` loads (transformers' names, ``config.json``, a sharded safetensors index);
built-in models a sharded state dict of ``nn.Sequential(*build_model(name).blocks)``
(``pipeweave.runtime.load_exported``). One output shard per checkpoint shard, written one at
a time: the whole model is never gathered in one process (docs/checkpoints.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .model_options import add_hf_config, add_hf_pretrained, chosen_model

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    from ..models import available_models

    parser = subparsers.add_parser(
        "export", help="write a checkpoint's weights as a from_pretrained folder (HF models) "
                       "or a sharded state dict", description=__doc__)
    parser.add_argument("--checkpoint", type=Path, required=True, metavar="DIR",
                        help="a checkpoint folder, a --checkpoint-dir, or a run's output folder "
                             "(its newest complete checkpoint)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="the folder to write (new or empty)")
    model = parser.add_argument_group(
        "the model (by default the one the checkpoint records; give it for checkpoints that "
        "record none)")
    model.add_argument("--model", choices=available_models(), default=None)
    add_hf_config(model)
    add_hf_pretrained(model)
    model.add_argument("--seq-len", type=int, default=None,
                       help="the --seq-len the run was trained with")
    parser.add_argument("--pipeline", type=int, default=None,
                        help="AvgPipe: export parallel pipeline N instead of the reference "
                             "model (the average)")
    parser.add_argument("--json", action="store_true", help="print what was written as JSON")
    parser.set_defaults(func=run)


def _model(args: argparse.Namespace) -> Any:
    from ..runtime import BuiltinModel

    name, overrides = chosen_model(args)
    if name is None:
        if args.seq_len is not None:
            raise ValueError("--seq-len needs --model (or --hf-config/--hf-pretrained); leave "
                             "them all out to use the model the checkpoint records")
        return None
    if args.seq_len is not None:
        overrides["seq_len"] = args.seq_len
    return BuiltinModel(name, overrides=overrides)


def run(args: argparse.Namespace) -> int:
    from ..runtime.checkpoint.export import describe, export_checkpoint

    if args.pipeline is not None and args.pipeline < 0:
        raise ValueError(f"--pipeline must be >= 0, got {args.pipeline}")
    result = export_checkpoint(args.checkpoint, args.out, model=_model(args),
                               pipeline=args.pipeline)
    if args.json:
        print(json.dumps(describe(result), indent=2))
        return 0
    kind = "a from_pretrained folder" if result.hf else "a sharded state dict"
    print(f"exported step {result.step}: {result.tensors} tensors, {result.bytes / 2**20:.1f} MiB "
          f"in {len(result.files)} file(s) -> {result.folder} ({kind}; largest file "
          f"{result.largest_file_bytes / 2**20:.1f} MiB)")
    return 0
