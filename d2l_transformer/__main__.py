"""``python -m d2l_transformer``: the ``d2l-transformer`` command (`cli.main`)."""

import sys

from .cli import main

sys.exit(main())
