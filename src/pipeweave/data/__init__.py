"""Offline datasets for pipeline training: stdlib bytes for GPT, sklearn digits for MLP/CNN.

Nothing is downloaded.  ``build_dataset(name, batch_size=...)`` returns an endless,
deterministic, resumable :class:`BatchStream` of ``(inputs, targets)``; see
``available_datasets()``.  A user's corpus (text, a folder of it, a ``.bin``/``.npy`` token
file): ``TokenData(path, batch_size=..., seq_len=...)()`` (:mod:`.own_data`).
"""

from pipeweave.data.own_data import TokenData
from pipeweave.data.registry import SEQUENCE_DATASETS, BatchStream, available_datasets, build_dataset

__all__ = ["SEQUENCE_DATASETS", "BatchStream", "TokenData", "available_datasets", "build_dataset"]
