"""Execution: one rank's stages, weight versions and the interpreter that runs its program."""
