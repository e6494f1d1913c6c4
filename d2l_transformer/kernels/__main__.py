"""``python -m d2l_transformer.kernels``: build the fused kernels now (``make venv`` does)."""

import sys

from . import build

try:
    print(build())
except RuntimeError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
