"""Rows (a) and (h) of scripts/bench.py: training tokens/s. (a) at the chapter's sizes: the
chapter's own code on d2l 0.11.4, the faithful and the fast path, the two baselines
(scripts/baselines.py); (e)'s rows train through `train_row` too. (h) the `full` preset on a
cached slice of its real batches. Each function returns ``(value, extra figures)``."""

import importlib.util
import os
import sys
import time

from bench_common import ROOT, chapter_data


def train_row(s, fast, params_path, ctx=None, kvstore=None):
    """Tokens/s over epochs 2.. (epoch 1 is warm-up: graph building, deferred init).

    ``ctx`` a list: data parallel over those devices; ``kvstore`` dist: this worker's shard of
    the data (half the batch each for 2 workers: the same global batch), global tokens/s."""
    import mxnet as mx

    import d2l_transformer as d2t
    from d2l_transformer.distributed.kvstore import GlobalSum
    cfg = s["cfg"]
    rank, num_workers = d2t.worker_info(kvstore)
    if num_workers > 1:
        src_vocab, tgt_vocab, it = d2t.load_data_nmt(cfg.batch_size // num_workers, cfg.num_steps,
                                                     cfg.num_examples, rank=rank,
                                                     num_workers=num_workers, fast_loader=fast)
    else:
        src_vocab, tgt_vocab, it = chapter_data(cfg, fast)  # the same batches either way
    tokens_per_epoch = sum(float((batch[3] - 1).sum()) for batch in it)  # Y_valid_len - 1
    tokens_per_epoch = GlobalSum(kvstore, 1)(tokens_per_epoch)[0]  # all workers' shards
    d2t.set_seed(0)  # both paths: the same initial weights and batches
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    stamps = []
    summary = d2t.train_s2s_ch8(model, it, cfg.lr, s["epochs"], ctx or mx.cpu(), fast=fast,
                                kvstore=kvstore,
                                on_epoch=lambda epoch, loss: stamps.append(time.time()))
    if fast and ctx is None and kvstore is None and params_path:
        model.save_parameters(params_path)
    rate = tokens_per_epoch * (len(stamps) - 1) / (stamps[-1] - stamps[0])
    return rate, {"loss": summary["loss"], "epochs_timed": len(stamps) - 1}


def _full_slice(s, cache_dir):
    """(h): ``(src vocabulary size, tgt vocabulary size, batches)``, the first `full_batches`
    batches of the `full` preset's bucketed loader (seed 0) as NumPy arrays; built once per
    benchmark run (tokenizer training and bucketing take a minute) and kept in `cache_dir`."""
    import pickle

    import d2l_transformer as d2t
    from d2l_transformer.data import load_data
    cfg = s["full_cfg"]
    path = os.path.join(cache_dir, f"full_slice_{s['full_batches']}.pkl")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return pickle.load(f)
    d2t.set_seed(0)
    src_vocab, tgt_vocab, it = load_data(cfg, cfg.batch_size)[:3]
    batches = [[a.asnumpy() for a in batch] for _, batch in zip(range(s["full_batches"]), it)]
    out = (len(src_vocab), len(tgt_vocab), batches)
    with open(path + ".tmp", "wb") as f:
        pickle.dump(out, f)
    os.replace(path + ".tmp", path)
    return out


def full_train_row(s, fast, cache_dir, precision="float32"):
    """(h) target tokens/s of `train_s2s_ch8` on the `full` preset's slice (`_full_slice`),
    its model, trainer (Adam, warmup) and loss (label smoothing, per-token), imperative
    (``fast=False``) or fast, its products in `precision` (as `train_model` settles it:
    `training.precision.settle`); every pass over the slice after the first is timed. Extra:
    the products' floating-point operations per pass (`step_flops`) and what they ran at."""
    import mxnet as mx
    from mxnet import init

    import d2l_transformer as d2t
    from d2l_transformer.training import precision as _precision
    from d2l_transformer.training.loss import MaskedSoftmaxCELoss
    from d2l_transformer.training.optim import config_trainer
    src_size, tgt_size, arrays = _full_slice(s, cache_dir)
    cfg = s["full_cfg"].replace(precision=precision)
    chosen, work = _precision.settle(cfg, tgt_size, mx.cpu(), fast=fast)  # before the first kernel
    if chosen.name != precision:
        return float("nan"), {"skipped": chosen.why}
    batches = [[mx.np.array(a, dtype="float32") for a in batch] for batch in arrays]
    tokens = sum(float(Y_len.sum() - len(Y_len)) for *_, Y_len in arrays)  # Y_valid_len - 1
    d2t.set_seed(0)  # both paths: the same initial weights
    model = d2t.build_model(cfg, src_size, tgt_size)
    model.initialize(init.Xavier(), ctx=mx.cpu())
    trainer = config_trainer(model, cfg)
    loss = MaskedSoftmaxCELoss(cfg.label_smoothing, reduction=cfg.loss_reduction)
    stamps = []
    summary = d2t.train_s2s_ch8(model, batches, cfg.lr, s["full_epochs"], mx.cpu(),
                                trainer=trainer, loss=loss, fast=fast, work=work,
                                precision=chosen.name,
                                on_epoch=lambda epoch, loss: stamps.append(time.time()))
    rate = tokens * (len(stamps) - 1) / (stamps[-1] - stamps[0])
    shapes = sorted({(X.shape[0], X.shape[1], Y.shape[1]) for X, _, Y, _ in arrays})
    flops = sum(step_flops(cfg, X.shape[0], X.shape[1], Y.shape[1] - 1, tgt_size)
                for X, _, Y, _ in arrays)
    return rate, {"loss": summary["loss"], "batches": len(arrays), "tokens_per_pass": tokens,
                  "passes_timed": len(stamps) - 1, "shapes": len(shapes),
                  "precision": chosen.name, "product_gflop_per_pass": flops / 1e9,
                  "product_gflops": flops / 1e9 * rate / tokens,
                  "detail": f"{chosen.name}; products {flops / 1e9:.0f} GFLOP a pass, "
                            f"{flops / 1e9 * rate / tokens:.0f} GFLOP/s achieved"}


def step_flops(cfg, batch, src_len, tgt_len, tgt_size):
    """Floating-point operations of one training step's matrix products (forward and the two
    backward products, 3 x 2 x multiply-adds): every Dense layer (the attention projections,
    the FFNs, the output layer) and the attention cores' two batched products, for a batch of
    `batch` sentences, `src_len` source and `tgt_len` target positions."""
    d, f, n = cfg.embedding_size, cfg.ffn_hidden_size, cfg.num_layers
    src, tgt = batch * src_len, batch * tgt_len  # rows
    encoder = src * (4 * d * d + 2 * d * f + 2 * src_len * d)  # projections, FFN, QK^T and AV
    decoder = tgt * (4 * d * d + 2 * tgt_len * d) + tgt * (2 * d * d + 2 * src_len * d) \
        + src * 2 * d * d + tgt * 2 * d * f  # self-attention, cross-attention (K, V on src), FFN
    return 6 * (n * (encoder + decoder) + tgt * d * tgt_size)


def baseline_row(s, key, cache_dir):
    """(a) ``train_torch`` / ``train_gluonnlp``, (h) ``train_full_torch`` (``_bf16``: under
    ``torch.autocast`` to bfloat16): the same model in PyTorch eager or GluonNLP 0.10
    hybridized (scripts/baselines.py) on the batches of the package's rows (NumPy copies),
    target tokens/s over epochs 2..; PyTorch on the threads the package's loop takes for that
    work (`_runtime.threads.threads_for` of the run's work), in the environment the user had
    (`_runtime.environ`: PyTorch is not the package's)."""
    import baselines

    from d2l_transformer._runtime import environ
    from d2l_transformer._runtime.threads import run_work, threads_for
    package = "gluonnlp" if key == "train_gluonnlp" else "torch"
    autocast = key.endswith("_bf16")  # torch.autocast("cpu", dtype=torch.bfloat16)
    if package == "torch":  # before PyTorch loads: it reads OMP_NUM_THREADS, its oneDNN the cap
        environ.restore_user_environ()
    reason = baselines.missing(package)
    if reason:
        return float("nan"), {"skipped": reason}
    if key.startswith("train_full_torch"):
        cfg, epochs = s["full_cfg"], s["full_epochs"]  # no AVX2 cap: the user's environment
        src_size, tgt_size, batches = _full_slice(s, cache_dir)
    else:
        cfg, epochs = s["cfg"], s["epochs"]
        src_vocab, tgt_vocab, it = chapter_data(cfg)
        src_size, tgt_size = len(src_vocab), len(tgt_vocab)
        batches = [[a.asnumpy() for a in batch] for batch in it]
    if package == "gluonnlp":
        return baselines.train_gluonnlp(batches, src_size, tgt_size, cfg, epochs)
    threads = threads_for(run_work(cfg, tgt_size))  # as `train_model` sizes the package's rows
    return baselines.train_torch(batches, src_size, tgt_size, cfg, epochs, threads, autocast)


def _oracle(name):
    """``import NAME`` from oracles/ (the book's code, kept outside the package and its path),
    loaded from its file and registered under its own name, as an import would."""
    if name not in sys.modules:
        path = os.path.join(ROOT, "oracles", name + ".py")
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(sys.modules[name])
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def book_row(s):
    """(a) the chapter's own code: its classes as printed (oracles/chapter_0_11.py, on the
    `d2l` 0.11.4 oracle the chapter imported) trained by d2l's own ``train_s2s_ch9``, on the
    same data; epochs timed from when the loop starts reading each epoch's batches."""
    import contextlib
    import io

    try:
        import d2l
    except ImportError:  # the oracle is a test dependency (make venv installs it)
        return float("nan"), {"skipped": "d2l 0.11.4 is not installed"}
    import mxnet as mx
    book = _oracle("chapter_0_11")

    import d2l_transformer as d2t
    cfg = s["cfg"]
    src_vocab, tgt_vocab, it = chapter_data(cfg)
    tokens_per_epoch = sum(float((batch[3] - 1).sum()) for batch in it)
    stamps = []

    class Timed:  # the DataLoader, stamping the start of every epoch
        def __iter__(self):
            stamps.append(time.time())
            return iter(it)

    d2t.set_seed(0)
    args = (cfg.embedding_size, cfg.ffn_hidden_size, cfg.num_heads, cfg.num_layers, cfg.dropout)
    model = d2l.EncoderDecoder(book.TransformerEncoder(len(src_vocab), *args),
                               book.TransformerDecoder(len(src_vocab), *args))  # as printed
    with contextlib.redirect_stdout(io.StringIO()):  # d2l's animator and book line
        d2l.train_s2s_ch9(model, Timed(), cfg.lr, s["epochs"], mx.cpu())
    stamps.append(time.time())
    rate = tokens_per_epoch * (len(stamps) - 2) / (stamps[-1] - stamps[1])  # epochs 2..
    return rate, {"epochs_timed": len(stamps) - 2}
