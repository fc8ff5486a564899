"""``pipeweave train``'s own-data options: ``--data PATH`` with ``--tokenizer DIR`` and
``--data-dtype``, and ``--eval-every N`` (a held-out loss every N steps).

``--data`` replaces the model's built-in corpus with a user's (:mod:`pipeweave.data.own_data`):
byte-level UTF-8 text by default, or a ``.bin``/``.npy`` token file. Every check on the data
runs here, before launch, each failure one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from torch import nn

from ..data import SEQUENCE_DATASETS
from ..data.own_data import TokenData, check_token_data
from ..data.token_files import TOKEN_DTYPES, bin_dtype
from ..devices import place
from ..models import ModelSpec
from ..runtime import Job
from ..runtime.observation.held_out import held_out_losses
from ..runtime.observation.results import RankResult

__all__ = ["EVAL_BATCHES", "add_data_options", "held_out", "own_data", "vocabulary_size"]

EVAL_BATCHES = 8
"""Most held-out batches (of ``--batch-size``) one evaluation reads: the whole held-out split
when it is smaller."""


def add_data_options(parser: Any) -> None:
    """Add the group of own-data options to ``parser``."""
    group = parser.add_argument_group("your own data")
    group.add_argument("--data", type=Path, default=None, metavar="PATH",
                       help="train on this corpus instead of the model's built-in one: a UTF-8 "
                            "text file or a folder of them (byte-level ids, vocabulary 256, "
                            "unless --tokenizer), or a token file (.bin as nanoGPT writes it, "
                            "or a 1-D .npy); memory-mapped; the last 5%% is held out")
    group.add_argument("--tokenizer", type=Path, default=None, metavar="DIR",
                       help="with a text --data: encode it with the tokenizer saved in this "
                            "local folder (tokenizer.json, or a transformers tokenizer)")
    group.add_argument("--data-dtype", default=None, choices=sorted(TOKEN_DTYPES),
                       help="the ids' dtype in a .bin --data (default: uint16 when the model's "
                            "vocabulary has at most 65,536 ids, as nanoGPT writes GPT-2's, else "
                            "uint32)")
    group.add_argument("--eval-every", type=int, default=0, metavar="N",
                       help="with --data: the loss on held-out batches every N steps, in the "
                            "metrics (eval_loss), TensorBoard and the summary")


def vocabulary_size(spec: ModelSpec) -> int | None:
    """The number of ids the model's first embedding takes (None: it takes no ids)."""
    for module in spec.blocks[0].modules():
        if isinstance(module, nn.Embedding):
            return int(module.num_embeddings)
    return None


def own_data(args: argparse.Namespace, spec: ModelSpec, *, name: str,
             seq_len: int | None) -> TokenData | None:
    """The corpus ``--data`` names for model ``name`` (``seq_len``: its sequence length),
    checked; None without ``--data``. The options that need ``--data`` are refused without."""
    if args.data is None:
        given = [flag for flag, value in (("--tokenizer", args.tokenizer),
                                          ("--data-dtype", args.data_dtype),
                                          ("--eval-every", args.eval_every)) if value]
        if given:
            raise ValueError(f"{given[0]} applies to --data only; add --data PATH or drop "
                             f"{given[0]}")
        return None
    vocab = vocabulary_size(spec)
    if spec.dataset not in SEQUENCE_DATASETS or vocab is None or seq_len is None:
        raise ValueError(f"--data trains language models, and {name} is not one; use a gpt-* "
                         f"or hf-* model (e.g. --model gpt-tiny)")
    if args.eval_every < 0:
        raise ValueError(f"--eval-every must be >= 0 (0: no held-out loss), got "
                         f"{args.eval_every}")
    suffix = args.data.suffix
    if args.tokenizer is not None and suffix in (".bin", ".npy"):
        raise ValueError(f"--tokenizer applies to text, and --data {args.data} holds token ids "
                         f"already; drop --tokenizer")
    if args.data_dtype is not None and suffix != ".bin":
        raise ValueError(f"--data-dtype applies to a .bin --data, not {args.data}; drop "
                         f"--data-dtype")
    data = TokenData(str(args.data), batch_size=args.batch_size, seq_len=seq_len,
                     seed=args.seed, labels=spec.dataset == "stdlib-bytes-labels",
                     dtype=bin_dtype(args.data_dtype, vocab),
                     tokenizer=None if args.tokenizer is None else str(args.tokenizer))
    check_token_data(data, vocab_size=vocab, held_out=args.eval_every > 0)
    return data


def held_out(job: Job, results: list[RankResult]) -> dict[int, float]:
    """Step -> held-out loss from the weights the ranks copied (``--eval-every``); ``{}``
    without. The batches: the held-out split in order, ``min(EVAL_BATCHES, windows // batch)``
    of them (at least one)."""
    if not job.eval_every or not isinstance(job.data, TokenData):
        return {}
    steps = sorted({step for result in results for step in result.snapshots})
    snapshots = {step: {name: tensor for result in results
                        for name, tensor in result.snapshots.get(step, {}).items()}
                 for step in steps}
    data = job.data.held_out()
    batches = min(EVAL_BATCHES, max(1, data.windows() // data.batch_size))
    device = place(job.device, local_rank=0, local_ranks=1).device
    return held_out_losses(job.model, data, snapshots, batches=batches, device=device)
