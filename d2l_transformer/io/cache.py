"""The package's cache directory: ``$D2L_TRANSFORMER_CACHE``, else ``~/.cache/d2l_transformer``
(what the package derives and can make again: the compiled kernels, CTranslate2's measured
thread counts)."""

import os

ENV = "D2L_TRANSFORMER_CACHE"


def cache_dir():
    """The cache directory's path (not created here)."""
    return os.environ.get(ENV) or os.path.join(os.path.expanduser("~"), ".cache",
                                               "d2l_transformer")
