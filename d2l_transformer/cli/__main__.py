"""``python -m d2l_transformer.cli``: the ``d2l-transformer`` command (`commands.main`)."""

import sys

from .commands import main

sys.exit(main())
