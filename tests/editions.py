"""What the tests of the later editions share: where each edition's d2l release is unpacked
(make venv does it), and the dataset they need."""

import os
import sys

import pytest

import d2l_transformer as d2t

RELEASES = {"0.17": "0.17.6", "1.0": "1.0.3"}

needs_data = pytest.mark.skipif(not os.path.exists(d2t.data.default_data_path()),
                                reason="fra-eng.zip is not there")


def library(edition):
    """The folder holding `edition`'s d2l, or skip the test with the reason."""
    path = os.path.join(sys.prefix, "oracles", "d2l-" + RELEASES[edition])
    if not os.path.isfile(os.path.join(path, "d2l", "mxnet.py")):
        pytest.skip(f"d2l=={RELEASES[edition]} is not unpacked in {path} (make venv does it)")
    return path
