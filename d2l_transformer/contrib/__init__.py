"""Beyond the translation model: checkpoint averaging and an encoder-only classifier."""
