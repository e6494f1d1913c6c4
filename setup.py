"""d2l_transformer: the Transformer of d2l 9.3 (MXNet numpy mode) as installable software.

MXNet comes through an extra, because the CPU and the CUDA builds are different packages that
both install the module `mxnet` and cannot sit side by side:

    pip install '.[cpu]'      # mxnet==1.9.1, the CPU build
    pip install '.[cu112]'    # mxnet-cu112==1.9.1 + the CUDA 11 libraries it needs
"""

import re

from setuptools import find_packages, setup


def read_version():
    """``__version__`` of d2l_transformer/_version.py, read as text (importing the package
    would import MXNet)."""
    with open("d2l_transformer/_version.py", encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M).group(1)


CUDA11 = [  # mxnet-cu112 links these but does not bundle them; d2l_transformer preloads them
    "nvidia-cuda-runtime-cu11",
    "nvidia-cuda-nvrtc-cu11",
    "nvidia-cublas-cu11",
    "nvidia-cufft-cu11",
    "nvidia-curand-cu11",
    "nvidia-cusolver-cu11",
    "nvidia-cusparse-cu11",
    "nvidia-cudnn-cu11>=8.5,<9",
    "nvidia-nccl-cu11",
]

setup(
    name="d2l_transformer",
    version=read_version(),
    description="The Transformer of d2l 9.3 (MXNet/Gluon), reproduced, tested and extended",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["d2l_transformer", "d2l_transformer.*"]),
    package_data={"d2l_transformer.kernels": ["*.cc", "*.h"],  # compiled on first use (kernels/)
                  "d2l_transformer.viz": ["static/*.html"]},  # the attention explorer page
    python_requires=">=3.8,<3.14",  # the Pythons it is tested on (docs/install.md)
    install_requires=[
        # mxnet 1.9.1 uses np.bool etc., removed in numpy 1.24: below 3.12 a numpy that still has
        # them; from 3.12 (no such numpy there) d2l_transformer/_runtime/compat.py sets them, and mxnet
        # needs numpy < 2 and distutils.version, which setuptools provides since 3.12
        "numpy>=1.16,<1.24; python_version < '3.12'",
        "numpy>=1.26,<2; python_version >= '3.12'",
        "setuptools; python_version >= '3.12'",
        "matplotlib",
        "sacrebleu>=2",  # sacrebleu.metrics.BLEU / CHRF and their signatures
        "sentencepiece",  # the subword presets' tokenizer
        "pycountry>=24.6.1",  # ISO 639 language codes and names (data.sources)
        "tqdm",  # the training progress bar
    ],
    extras_require={
        "cpu": ["mxnet==1.9.1"],
        "cu112": ["mxnet-cu112==1.9.1"] + CUDA11,
        # ipython<9 for the d2l oracle (IPython 9 lost set_matplotlib_formats); gluonnlp for
        # the reference beam search (tests/decoding_reference.py)
        "test": ["pytest", "ruff", "pandas", "ipython<9", "httpx", "selenium", "libretranslatepy",
                 "gluonnlp==0.10.0"],
        "serve": ["fastapi", "uvicorn"],  # d2l-transformer serve
        # export --format ctranslate2 (its spec API; 4.x: the TransformerSpec the export fills)
        "ctranslate2": ["ctranslate2>=4,<5; python_version >= '3.9'"],  # no wheel for 3.8
        "notebook": ["notebook", "nbclient", "nbformat", "ipykernel"],
    },
    entry_points={"console_scripts": ["d2l-transformer=d2l_transformer.cli:main"]},
)
