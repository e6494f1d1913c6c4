"""Make the CUDA 11 libraries of the ``cu112`` extra loadable before MXNet is imported.

``mxnet-cu112`` links against ``libcudart.so.11.0``, ``libcublas.so.11``, ``libcudnn.so.8``,
``libnccl.so.2``, ... but bundles none of them. The extra installs NVIDIA's ``nvidia-*-cu11``
wheels, which put those libraries under ``site-packages/nvidia/<name>/lib``, a directory the
dynamic loader does not search. Loading them here with ``RTLD_GLOBAL`` (in dependency order)
lets ``import mxnet`` resolve them. Without the ``nvidia`` wheels (the CPU install) this does
nothing. Imports no MXNet.
"""

import ctypes
import glob
import importlib.util
import logging
import os

log = logging.getLogger(__name__)

# dependency order: the runtime first, cuDNN's sub-libraries after cuBLAS, NCCL last
_LIBRARY_DIRS = ["cuda_runtime", "cuda_nvrtc", "cublas", "cufft", "curand", "cusparse",
                 "cusolver", "cudnn", "nccl"]


def nvidia_library_paths():
    """The shared libraries of the installed ``nvidia-*-cu11`` wheels, in load order."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    paths = []
    for root in spec.submodule_search_locations:
        for name in _LIBRARY_DIRS:
            libs = sorted(glob.glob(os.path.join(root, name, "lib", "lib*.so*")))
            # cublasLt before cublas, the cudnn core before its ops/adv/cnn parts
            libs.sort(key=lambda p: (not os.path.basename(p).startswith(("libcublasLt", "libcudnn.")), p))
            paths += libs
    return paths


def preload():
    """Load every library found; report (at debug level) any that does not load."""
    loaded = 0
    for path in nvidia_library_paths():
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            loaded += 1
        except OSError as e:  # e.g. a library for another CUDA version
            log.debug("could not preload %s: %s", path, e)
    return loaded
