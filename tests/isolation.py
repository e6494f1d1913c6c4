"""Code run in a fresh interpreter (``python -I -c BLOCKER + code``) that must not use the
package: a finder that refuses ``d2l_transformer``, which the venv could otherwise import
(tests of the exports' reference decoders and of the CTranslate2 export's README snippet)."""

BLOCKER = """
import importlib.abc, runpy, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "d2l_transformer":
            raise ImportError("d2l_transformer is not available in this process")
sys.meta_path.insert(0, Blocked())
"""
