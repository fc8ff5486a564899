"""Hugging Face models for the adapter's tests, and a reference trained by HF's own forward.

The models are built here from transformers' config classes (not by pipeweave's presets), and
:func:`hf_reference` trains one with ``model(ids, labels=ids).loss`` and a ``torch.optim`` step,
no pipeweave code: what the pipelined runs are checked against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pipeweave.runtime import BuiltinData, Job, OptimizerFactory, Plan

SEQ = 16
LAYERS = 2


def hf_model(family: str, *, tied: bool = False, seed: int = 0, layers: int = LAYERS,
             dtype: torch.dtype = torch.float64, **config: Any) -> Any:
    """A small random ``GPT2LMHeadModel`` / ``*ForCausalLM`` of ``family`` (no dropout)."""
    import transformers

    shape: dict[str, Any] = {"vocab_size": 256, "tie_word_embeddings": tied,
                             "bos_token_id": None, "eos_token_id": None}
    if family == "gpt2":
        shape.update(n_positions=SEQ, n_embd=32, n_layer=layers, n_head=2, n_inner=64,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        config_class, model_class = transformers.GPT2Config, transformers.GPT2LMHeadModel
    else:
        shape.update(hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
        names = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}[family]
        config_class = getattr(transformers, f"{names}Config")
        model_class = getattr(transformers, f"{names}ForCausalLM")
    shape.update(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config_class(**shape))
    return model.to(dtype)


@dataclass(frozen=True)
class HFFactory:
    """Job model factory (picklable): :func:`hf_model` through ``pipeweave.hf.blocks``."""

    family: str
    sublayer: bool = False
    tied: bool = False
    layers: int = LAYERS
    padding: bool = False

    def __call__(self) -> Any:
        import pipeweave.hf

        return pipeweave.hf.blocks(hf_model(self.family, tied=self.tied, layers=self.layers),
                                   sublayer=self.sublayer, padding=self.padding)


@dataclass(frozen=True)
class PretrainedFactory:
    """Job model factory (picklable): the model saved at ``path`` (``save_pretrained``), loaded
    with ``from_pretrained`` — which returns it in eval mode — through ``pipeweave.hf.blocks``.
    ``dropout``: overrides the saved GPT-2's dropout probabilities (None: as saved)."""

    path: str
    dropout: float | None = None

    def __call__(self) -> Any:
        import pipeweave.hf
        import transformers

        overrides = ({} if self.dropout is None else
                     {"resid_pdrop": self.dropout, "embd_pdrop": self.dropout,
                      "attn_pdrop": self.dropout})
        model = transformers.AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float64,
                                                                  **overrides)
        return pipeweave.hf.blocks(model)


@dataclass(frozen=True)
class PaddedData:
    """The byte corpus, left-padded: sample ``i`` of a batch keeps its last ``lengths[i]``
    tokens. Inputs ``int64 [B, 2, T]`` (ids with ``pad`` at padding, HF's attention_mask),
    labels the ids with ``-100`` at padding."""

    batch_size: int
    lengths: tuple[int, ...]
    pad: int = 0

    def __call__(self) -> Any:
        source = BuiltinData("stdlib-bytes-labels", batch_size=self.batch_size, seq_len=SEQ,
                             dtype="float64")
        kept = torch.tensor(self.lengths)[:, None]
        for ids, _ in source():
            mask = (torch.arange(SEQ)[None, :] >= SEQ - kept).to(torch.int64)
            ids = torch.where(mask.bool(), ids, self.pad)
            yield torch.stack([ids, mask], 1), ids.masked_fill(mask == 0, -100)


def num_blocks(sublayer: bool, layers: int = LAYERS) -> int:
    return (2 if sublayer else 1) * layers + 2


def hf_job(family: str, *, sublayer: bool, schedule: str = "1f1b", depth: int = 2,
           tied: bool = False, microbatches: int = 4, steps: int = 3) -> Job:
    plan = Plan.uniform(num_blocks(sublayer), depth, schedule=schedule, microbatches=microbatches)
    return Job(plan=plan, steps=steps, model=HFFactory(family, sublayer, tied),
               data=BuiltinData("stdlib-bytes-labels", batch_size=2 * microbatches, seq_len=SEQ,
                                dtype="float64"),
               optimizer=OptimizerFactory("sgd", {"lr": 0.05, "momentum": 0.9}),
               return_parameters=True)


@dataclass(frozen=True)
class HFReference:
    losses: list[float]
    parameters: dict[str, torch.Tensor]
    """Final values, keyed by the pipeline's global names (``"<block>.<name>"``)."""


def hf_reference(job: Job, family: str, *, sublayer: bool, tied: bool = False,
                 layers: int = LAYERS) -> HFReference:
    """Train the HF model on the job's batches with its own loss and ``torch.optim.SGD``."""
    import pipeweave.hf

    model = hf_model(family, tied=tied, layers=layers)
    # Name each HF parameter as the pipeline does, by the identity of the object the adapter's
    # blocks hold (training below uses the model only).
    spec = pipeweave.hf.blocks(model, sublayer=sublayer)
    global_name: dict[int, str] = {}
    for i, block in enumerate(spec.blocks):
        for n, p in block.named_parameters():
            global_name.setdefault(id(p), f"{i}.{n}")  # a tied weight: its first block's name
    names = {name: global_name[id(p)] for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = iter(job.data())
    losses = []
    model.train()
    for _ in range(job.steps):
        ids, labels = next(batches)
        mask = None
        if ids.dim() == 3:  # PaddedData: ids and attention_mask
            ids, mask = ids[:, 0], ids[:, 1]
        loss = model(ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return HFReference(losses, {names[n]: p.detach().clone() for n, p in model.named_parameters()})
