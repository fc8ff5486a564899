"""``python -m pipeweave`` runs the command-line interface."""

import sys

try:
    from .cli.main import entry
except KeyboardInterrupt:  # Ctrl-C while the command line itself is imported: no traceback
    print("pipeweave: error: interrupted (Ctrl-C)", file=sys.stderr)
    raise SystemExit(130) from None

if __name__ == "__main__":
    entry()
