"""``--model NAME`` and ``--hf-config FILE``: which registered model a command builds; and
:func:`add_profile_source`, the options of the commands that read a profile or make one
(``plan``, ``auto``, ``placement``, ``simulate``).

``--hf-config`` takes a transformers ``config.json`` of a family ``pipeweave.hf`` adapts; the
model is then ``hf-<model_type>`` built from that config with random weights (``--model`` may
be left out, or must name that same family). ``--hf-pretrained`` (``train``) takes a folder
``save_pretrained`` wrote: its config and its weights, read per stage.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["HF_CONFIG_HELP", "add_hf_config", "add_hf_pretrained", "add_profile_source",
           "chosen_model", "check_profile_source"]

HF_CONFIG_HELP = ("a Hugging Face config.json (gpt2, llama, qwen2 or mistral) to build the "
                  "model from, with random weights; implies --model hf-<its model_type>")


def add_hf_config(parser: Any) -> None:
    """Add ``--hf-config FILE`` to a parser or argument group."""
    parser.add_argument("--hf-config", type=Path, default=None, metavar="FILE.json",
                        help=HF_CONFIG_HELP)


def add_hf_pretrained(parser: Any) -> None:
    """Add ``--hf-pretrained DIR`` to a parser or argument group."""
    parser.add_argument("--hf-pretrained", type=Path, default=None, metavar="DIR",
                        help="a local folder written by save_pretrained (config.json and "
                             "model.safetensors or a sharded index; gpt2, llama, qwen2 or "
                             "mistral): its weights, each rank reading only its own stage's; "
                             "implies --model hf-<its model_type>")


MODEL_HELP = "built-in model (profiled now unless --profile is given)"
PROFILE_HELP = "profile JSON from `pipeweave profile`, or PipeDream's graph.txt"
BATCH_SIZE_HELP = "with --model and no --profile: samples per profiled micro-batch"
DEVICE_HELP = "with --model and no --profile: device to profile on"


def add_profile_source(parser: Any, *, model_help: str = MODEL_HELP,
                       profile_help: str = PROFILE_HELP, repeat_profile: bool = False,
                       batch_size_default: int | None = 4,
                       batch_size_help: str = BATCH_SIZE_HELP,
                       device_help: str = DEVICE_HELP) -> None:
    """Add ``--model``, ``--hf-config``, ``--profile``, ``--batch-size`` and ``--device`` to a
    parser or argument group: where a command's costs come from (a profile file, or the model
    profiled now). ``repeat_profile``: ``--profile`` may be given several times (a list)."""
    from ..model_names import model_names  # no torch: --help and a saved profile stay quick

    parser.add_argument("--model", choices=model_names(), default=None, help=model_help)
    add_hf_config(parser)
    parser.add_argument("--profile", type=Path, default=None, help=profile_help,
                        **({"action": "append"} if repeat_profile else {}))
    parser.add_argument("--batch-size", type=int, default=batch_size_default,
                        help=batch_size_help)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help=device_help)


def chosen_model(args: argparse.Namespace, *, default: str | None = None
                 ) -> tuple[str | None, dict[str, Any]]:
    """``(name, build_model overrides)`` from ``--model`` and ``--hf-config``; ``--seq-len``,
    where the command has it, is left to the caller."""
    model: str | None = args.model
    path: Path | None = getattr(args, "hf_config", None)
    folder: Path | None = getattr(args, "hf_pretrained", None)
    if path is None and folder is None:
        return (model if model is not None else default), {}
    from ..hf.presets import config_family  # names the file and the fix if it cannot be read

    if folder is not None:
        if path is not None:
            raise ValueError("give --hf-pretrained DIR or --hf-config FILE, not both (the "
                             "folder has its own config.json)")
        from ..hf.pretrained import check_pretrained

        flag, given = "--hf-pretrained", folder
        name = f"hf-{config_family(check_pretrained(folder), flag=flag)}"
        overrides: dict[str, Any] = {"pretrained": str(folder)}
    else:
        assert path is not None
        flag, given = "--hf-config", path
        name = f"hf-{config_family(path)}"
        overrides = {"config_file": str(path)}
    if model is not None and model != name:
        raise ValueError(f"{flag} {given} is a {name.removeprefix('hf-')} model but --model "
                         f"is {model}; drop --model or use --model {name}")
    return name, overrides


def check_profile_source(args: argparse.Namespace) -> None:
    """What :func:`add_profile_source` added, checked before anything is profiled: a model
    (``--model``/``--hf-config``, readable) or a profile is given, the profile files can be
    read, and ``--batch-size`` is at least 1."""
    from ..files import read_text

    model, _ = chosen_model(args)
    given = args.profile if isinstance(args.profile, list) else \
        [args.profile] if args.profile is not None else []
    if not given and model is None:
        raise ValueError("give --model NAME (profiled now) or --profile FILE")
    for path in given:
        read_text(path, what=f"profile file {path}",
                  fix="create one with `pipeweave profile --model NAME --json-out FILE`")
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}; give a positive "
                         f"number of samples")
