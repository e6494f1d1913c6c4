"""The cu112 extra's CUDA libraries are found and put in dependency order (no GPU needed)."""

import importlib.util
import sys

from d2l_transformer._runtime import cuda as _cuda


def test_nvidia_libraries_found_in_load_order(tmp_path, monkeypatch):
    for name, libs in {"cudnn": ["libcudnn_ops_infer.so.8", "libcudnn.so.8"],
                       "cublas": ["libcublas.so.11", "libcublasLt.so.11"],
                       "cuda_runtime": ["libcudart.so.11.0"]}.items():
        d = tmp_path / "nvidia" / name / "lib"
        d.mkdir(parents=True)
        for lib in libs:
            (d / lib).write_bytes(b"not a real library")
    (tmp_path / "nvidia" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    names = [p.rsplit("/", 1)[1] for p in _cuda.nvidia_library_paths()]
    assert names == ["libcudart.so.11.0", "libcublasLt.so.11", "libcublas.so.11",
                     "libcudnn.so.8", "libcudnn_ops_infer.so.8"]
    assert _cuda.preload() == 0  # fake files do not load, and that is not an error


def test_preload_matches_the_install():
    """The CPU install has no ``nvidia`` wheels and preloads nothing; the cu112 install preloads
    its CUDA libraries (each one that loads counts once)."""
    paths = _cuda.nvidia_library_paths()
    if importlib.util.find_spec("nvidia") is None:
        assert paths == [] and _cuda.preload() == 0
    else:
        assert paths and 0 < _cuda.preload() <= len(paths)
