"""`SameNames`: a variant's block keeps the Gluon name of the chapter's class it extends."""

_OURS = __name__.rpartition(".")[0] + "."  # the modules of variants/


class SameNames:
    """Gluon names a block's parameters after its class (``addnorm0_...``): a subclass defined
    in one of the variants' modules keeps the name of the first class of its ancestry outside
    them (the chapter's, or Gluon's)."""

    def _alias(self):
        return next(c for c in type(self).__mro__
                    if not c.__module__.startswith(_OURS)).__name__.lower()
