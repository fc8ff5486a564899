"""Offline datasets for pipeline training: stdlib bytes for GPT, sklearn digits for MLP/CNN.

Nothing is downloaded.  ``build_dataset(name, batch_size=...)`` returns an endless,
deterministic, resumable :class:`BatchStream` of ``(inputs, targets)``; see
``available_datasets()``.
"""

from pipeweave.data.registry import SEQUENCE_DATASETS, BatchStream, available_datasets, build_dataset

__all__ = ["SEQUENCE_DATASETS", "BatchStream", "available_datasets", "build_dataset"]
