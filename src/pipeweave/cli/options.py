"""What more than one command reads, read the same way by each, so that no command imports
another:

* ``--option KEY=VALUE`` (``show``, ``simulate``, ``train``): ``true``/``false`` (any case)
  are booleans, then an integer, a float, JSON (a list, an object, ``null``), else the text as
  it is. ``train --option vertical_sync=True`` and ``show --option vertical_sync=True`` mean
  the same;
* sizes in bytes (``--memory-limit`` of ``plan``, ``auto``, ``train``, ``tune``);
* ``--shared-cores N|auto|none`` (``plan``, ``auto``);
* the profile a command plans with: read from a file, or the model profiled now
  (``plan``, ``placement``, ``simulate``, ``auto``);
* SCHEDULE and its shape options (``show``, ``simulate``);
* ``--mesh pp=P,dp=D,tp=T`` (``train``), the long form of ``--stages P --width D`` with
  ``tp`` tensor-parallel processes per pipeline rank.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..ir import Schedule
from ..profiler import Profile
from ..schedules import Shape, build_schedule, get_info

__all__ = ["parse_option", "parse_options", "parse_bytes", "core_count", "shared_cores",
           "load_profile", "profile_from_args", "add_shape_arguments", "schedule_from_args",
           "default_iterations", "parse_mesh"]


def parse_option(text: str) -> tuple[str, object]:
    """``(key, value)`` of one ``KEY=VALUE`` (module docstring); ValueError naming the form."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"option {text!r} is not KEY=VALUE; write it like --option advance=2")
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return key.strip(), lowered == "true"
    for convert in (int, float):
        try:
            return key.strip(), convert(raw)
        except ValueError:
            continue
    try:
        return key.strip(), json.loads(raw)
    except json.JSONDecodeError:
        return key.strip(), raw


def parse_options(texts: Iterable[str]) -> dict[str, object]:
    """Every ``--option`` of a command as one mapping (a later key wins)."""
    return dict(parse_option(text) for text in texts)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> float:
    """``16e9``, ``16GB``, ``16GiB``, ``512MiB`` -> bytes."""
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    try:
        if match is None or unit not in _UNITS:
            raise ValueError
        value = float(match.group(1)) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"--memory-limit {text!r} is not a size; give bytes like 16e9, 16GB or "
                         "16GiB") from None
    if value <= 0:
        raise ValueError(f"--memory-limit must be > 0 bytes, got {text!r}")
    return value


def core_count(option: str) -> int | None:
    """``--shared-cores`` checked before any profile exists: the number it gives (None for
    ``auto``/``none``, which :func:`shared_cores` decides)."""
    if option in ("auto", "none"):
        return None
    try:
        cores = int(option)
    except ValueError:
        cores = 0
    if cores < 1:
        raise ValueError(f"--shared-cores {option!r} is not a core count; give a number >= 1, "
                         f"'auto' or 'none'")
    return cores


def shared_cores(option: str, profile: Profile, ranks: int) -> int | None:
    """``--shared-cores``: a number, ``none``, or ``auto``
    (:func:`pipeweave.measure.local_shared_cores`: the CPU profile's machine cores when
    ``ranks`` outnumber them)."""
    if option == "none":
        return None
    if option == "auto":
        from ..measure import local_shared_cores

        return local_shared_cores(profile, ranks=ranks)
    return core_count(option)


def load_profile(*, model: str | None, path: Path | None, batch_size: int, device: str,
                 ranks: int, overrides: Mapping[str, Any] | None = None) -> Profile:
    """The profile at ``path``, checked to be of ``model`` (when given); or, without a path,
    ``model`` profiled now for ``ranks`` local ranks (:func:`pipeweave.measure.profile_model`)."""
    overrides = dict(overrides or {})
    if path is None:
        from ..measure import profile_model

        if model is None:
            raise ValueError("give --model NAME (profiled now) or --profile FILE")
        return profile_model(model=model, batch_size=batch_size, ranks=ranks, device=device,
                             overrides=overrides)
    profile = Profile.load(path)
    if model is not None:
        from ..models import build_model

        blocks = len(build_model(model, **overrides).blocks)
        if profile.num_blocks != blocks or profile.model != model:
            raise ValueError(
                f"profile {path} is of model {profile.model!r} with {profile.num_blocks} "
                f"blocks but --model {model} has {blocks} blocks; profile this model with "
                f"`pipeweave profile --model {model}`"
            )
    return profile


def profile_from_args(args: argparse.Namespace, *, ranks: int) -> Profile:
    """:func:`load_profile` from the options ``model_options.add_profile_source`` added (one
    ``--profile``), checked first (``check_profile_source``)."""
    from .model_options import check_profile_source, chosen_model

    check_profile_source(args)
    model, overrides = chosen_model(args)
    return load_profile(model=model, path=args.profile, batch_size=args.batch_size,
                        device=args.device, ranks=ranks, overrides=overrides)


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """SCHEDULE and the shape options shared by ``show`` and ``simulate``."""
    parser.add_argument("schedule", metavar="SCHEDULE",
                        help="schedule name (see `pipeweave schedules`)")
    parser.add_argument("--stages", "-P", type=int, required=True,
                        help="pipeline depth P (ranks per pipeline copy)")
    parser.add_argument("--microbatches", "-M", type=int, required=True,
                        help="micro-batches per iteration M")
    parser.add_argument("--iterations", "-K", type=int, default=None,
                        help="iterations K (default 1; `simulate` uses 4 for asynchronous "
                             "schedules so a steady state exists)")
    parser.add_argument("--chunks", "-V", type=int, default=1,
                        help="model chunks per rank (interleaved, WPipe)")
    parser.add_argument("--replicas", default=None, metavar="R0,R1,...",
                        help="replicas per stage, comma-separated (PipeDream 1F1B-RR)")
    parser.add_argument("--width", type=int, default=1,
                        help="data-parallel copies of the whole pipeline")
    parser.add_argument("--pipelines", "-N", type=int, default=1,
                        help="parallel pipelines sharing the ranks (AvgPipe)")
    parser.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                        help="generator option, repeatable (e.g. -o advance=2)")


def schedule_from_args(args: argparse.Namespace, *, default_iterations: int = 1) -> Schedule:
    """Build the schedule the shape arguments describe (library ValueErrors propagate)."""
    options = parse_options(args.option)
    iterations = args.iterations if args.iterations is not None else default_iterations
    shape = Shape(
        stages=args.stages, microbatches=args.microbatches, iterations=iterations,
        chunks=args.chunks, width=args.width, replicas=_parse_replicas(args.replicas),
        pipelines=args.pipelines, options=options,
    )
    return build_schedule(args.schedule, shape)


def default_iterations(name: str) -> int:
    """1 for a synchronous schedule, 4 for an asynchronous one (fill, 2 steady, drain)."""
    return 1 if get_info(name).synchronous else 4


def _parse_replicas(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            f"--replicas {text!r} must be comma-separated integers, one per stage, e.g. 2,1,1,1"
        ) from None


MESH_DIMENSIONS = ("pp", "dp", "tp")


def parse_mesh(text: str) -> tuple[int, int, int]:
    """``--mesh pp=P,dp=D,tp=T`` -> ``(P, D, T)``: pipeline depth, data-parallel width and
    tensor-parallel size (``dp`` and ``tp`` 1 where not given; docs/sharding.md)."""
    sizes: dict[str, int] = {}
    for part in text.split(","):
        name, _, value = part.strip().partition("=")
        if name not in MESH_DIMENSIONS or not value.strip().isdigit() or name in sizes:
            raise ValueError(f"--mesh {text!r}: give each of pp, dp, tp at most once as NAME=N, "
                             f"comma-separated, e.g. --mesh pp=2,dp=2")
        sizes[name] = int(value)
    if "pp" not in sizes:
        raise ValueError(f"--mesh {text!r} names no pp (pipeline depth); e.g. --mesh pp=2,dp=2")
    if any(size < 1 for size in sizes.values()):
        raise ValueError(f"--mesh {text!r}: every size must be >= 1")
    return sizes["pp"], sizes.get("dp", 1), sizes.get("tp", 1)
