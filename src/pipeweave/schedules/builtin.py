"""Imports every built-in generator so that it registers itself."""

from . import (  # noqa: F401
    avgpipe,
    gpipe,
    gpipe_grouped,
    interleaved,
    interleaved_zb,
    one_f_one_b,
    pipedream,
    pipeoptim,
    sliced,
    two_bw,
    v_blocks,
    wpipe,
    zbv,
    zero_bubble,
)
