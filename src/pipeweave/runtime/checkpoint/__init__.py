"""Checkpoints: options, the on-disk store, and saving/restoring a rank at iteration boundaries."""
