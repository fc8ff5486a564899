"""Observation: what a run records about itself (timeline, memory, progress, summary)."""
