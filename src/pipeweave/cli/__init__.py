"""Command-line interface (``pipeweave ...``)."""
