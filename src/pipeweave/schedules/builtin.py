"""Imports every built-in generator so that it registers itself."""

from . import gpipe, one_f_one_b  # noqa: F401
