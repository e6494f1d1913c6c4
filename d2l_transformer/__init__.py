"""d2l_transformer: the Transformer of d2l 9.3 (MXNet numpy mode), as installable software.

The public names: the chapter's blocks, data pipeline, loop and prediction, and the package's
configs and translator, grouped by the module that holds them.
"""

from . import _runtime
from ._version import __version__

_runtime.prepare()  # NumPy's aliases, threads, CPU kernels, CUDA libraries: before MXNet loads

try:
    from mxnet import npx
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        "d2l_transformer needs MXNet 1.9.1: pip install 'd2l_transformer[cpu]' "
        "(or '[cu112]' for an NVIDIA GPU)") from e

_runtime.quietly(npx.set_np)  # the chapter runs MXNet in numpy mode

from .attention import (  # noqa: E402
    DotProductAttention,
    MultiHeadAttention,
    masked_softmax,
    transpose_output,
    transpose_qkv,
)
from .build import build_model  # noqa: E402
from .config import CHAPTER, FULL, PRESETS, TINY, TransformerConfig  # noqa: E402
from .context import parse_ctx, parse_ctx_list, try_gpu  # noqa: E402
from .data import (  # noqa: E402
    DataError,
    Vocab,
    build_array,
    load_data_nmt,
    preprocess_nmt,
    read_data_nmt,
    tokenize_nmt,
    truncate_pad,
)
from .distributed.kvstore import create_kvstore, worker_info  # noqa: E402
from .inference.decode import predict_s2s_ch8  # noqa: E402
from .inference.translator import Hypothesis, Translator  # noqa: E402
from .layers import AddNorm, PositionalEncoding, PositionWiseFFN  # noqa: E402
from .model import (  # noqa: E402
    Decoder,
    DecoderBlock,
    Encoder,
    EncoderBlock,
    EncoderDecoder,
    TransformerDecoder,
    TransformerEncoder,
)
from .report.book import book_line  # noqa: E402
from .training import (  # noqa: E402
    ClipAdam,
    MaskedSoftmaxCELoss,
    TrainGraph,
    grad_clipping,
    make_trainer,
    set_seed,
    train_s2s_ch8,
)
