"""One training step, three ways with the same arithmetic: imperative (the chapter's), one
hybridized graph (`TrainGraph`), and data-parallel over several devices or workers."""

from mxnet import autograd, gluon

from .. import _gluon, _graphs, kernels
from ..seq2seq import Seq2SeqDecoder, Seq2SeqEncoder
from ..seq2seq_attention import Seq2SeqAttentionDecoder
from . import fused
from .loss import MaskedSoftmaxCELoss, step_size
from .optim import CLIP_THETA, ClipAdam, clip_global, clip_threshold, grad_clipping


class TrainGraph(gluon.HybridBlock):
    """Fast path: the encoder, the decoder's call on a fresh state and the loss as ONE graph.

    Holds the model's own encoder and decoder (no copied model code); returns the (batch,) loss.
    The fused kernels are put in place while it traces (`fused.FastGraph`).
    """

    def __init__(self, model, loss=None, **kwargs):
        super().__init__(**kwargs)
        self.encoder = model.encoder
        self.decoder = model.decoder
        self.loss = loss or MaskedSoftmaxCELoss()

    def hybrid_forward(self, F, X, X_vlen, Y_input, Y_label, Y_vlen):
        enc_outputs = self.encoder(X, X_vlen)  # (batch, num_steps, d)
        state = self.decoder.init_state(enc_outputs, X_vlen)
        Y_hat, _ = self.decoder(Y_input, state)  # (batch, num_steps - 1, vocab)
        return self.loss(Y_hat, Y_label, Y_vlen)  # (batch,)


def traceable(model_or_cfg):
    """Whether `TrainGraph` can trace the model (the fast path), given built or as its config:
    the Transformer's (the chapter's, its exact runs' and its variants'), not the 2019 book's
    seq2seq models (8.14, 9.2), whose LSTM encoder reads the valid lengths on the host and whose
    9.2 decoder steps through time in Python. The one rule: `train_s2s_ch8` trains a model it
    cannot trace on the imperative step, and `training.run` asks it of a config."""
    if hasattr(model_or_cfg, "architecture"):  # a TransformerConfig: what `build_model` builds
        return model_or_cfg.architecture == "transformer"
    return not (isinstance(model_or_cfg.encoder, Seq2SeqEncoder) or isinstance(
        model_or_cfg.decoder, (Seq2SeqDecoder, Seq2SeqAttentionDecoder)))


def output_layer_width(decoder):
    """The width of the rows the output layer ``decoder.dense`` multiplies (its in_units, which
    Gluon knows only after the deferred initialisation): the Transformer's ``embedding_size``;
    an LSTM decoder's units (8.14, 9.2: the LSTM's outputs feed it), from its state's shape."""
    lstm = getattr(decoder, "rnn", None)
    if lstm is None:
        return decoder.embedding_size
    return lstm.state_info()[0]["shape"][-1]  # H of [H, C]: (layers, batch, units)


def _imperative_step(model, trainer, loss, clip_per_token=False):
    """The chapter's step (9.3.7, d2l's ``train_s2s_ch9``): forward and loss under
    ``autograd.record``, backward, d2l's `grad_clipping` of the summed loss's gradient, then
    ``trainer.step(num_tokens)``. Returns the batch's summed loss and its tokens, as floats."""
    def step(X, X_vlen, Y_input, Y_label, Y_vlen):
        with autograd.record():
            Y_hat, _ = model(X, Y_input, X_vlen, Y_vlen)
            l = loss(Y_hat, Y_label, Y_vlen)  # (batch,)
        l.backward()
        num_tokens = step_size(loss, Y_vlen)
        grad_clipping(model, clip_threshold(num_tokens, clip_per_token))  # no sync before it
        trainer.step(num_tokens)
        return float(l.sum()), float(num_tokens)
    return step


def _graph(model, loss, precision="float32", static=True):
    """The hybridized `TrainGraph` with the kernels in place (`fused.FastGraph`; its products
    in `precision`, `training.precision`), traced again when a block in it changes (`_graphs`:
    DropHead rate, pruning). ``static``: its buffers planned once and kept
    (``static_alloc``/``static_shape``), for batches of one shape (`static_batches`). The step
    that calls it is its only holder: dropping the step frees the graph, its copy and their
    buffers."""
    graph = _graphs.track(TrainGraph(model, loss))
    graph.hybridize(static_alloc=static, static_shape=static)
    return fused.FastGraph(graph, precision)


def static_batches(data_iter):
    """Whether a graph fed `data_iter` keeps its buffers (`_graph`'s ``static``): the one rule.
    Yes for batches of one shape (the chapter's arrays padded to ``num_steps``; a last smaller
    batch re-plans once an epoch); no for batches by length (`data.BucketBatches`, with its
    ``shapes``), shuffled across buckets: the shape changes at nearly every step, so a static
    graph plans its buffers again at every step anyway and only keeps the largest shape's
    beside the allocator's (docs/data.md, "Memory")."""
    return len(getattr(data_iter, "shapes", ())) <= 2


def _fast_step(model, trainer, loss, clip_per_token=False, precision="float32", static=True):
    """The fast path's train step: one hybridized graph, `ClipAdam` (or one-pass
    clipping + ``trainer.step`` where it does not apply); loss and token count stay on the
    device. Same signature and meaning as the faithful step in `train_s2s_ch8`; ``precision``:
    the graph's products' (`fused.FastGraph`, `training.precision`); ``static``: `_graph`'s.
    The graph is traced again when a block in it changes (`_graphs`: DropHead rate, pruning,
    kernels)."""
    graph = _graph(model, loss, precision, static)
    params = [p for p in model.collect_params().values() if p.grad_req != "null"]
    update = []  # the ClipAdam, built after the first step's deferred initialisation

    def step(X, X_vlen, Y_input, Y_label, Y_vlen):
        if _gluon.deferred(params):  # deferred init in the faithful order
            model(X, Y_input, X_vlen, Y_vlen)
        with autograd.record(), kernels.fused(X.ctx):  # traced once, with the CPU kernels
            l = graph(X, X_vlen, Y_input, Y_label, Y_vlen)  # (batch,)
        l.backward()
        num_tokens = step_size(loss, Y_vlen)
        if not update:
            update.append(ClipAdam(trainer, params, CLIP_THETA, per_token=clip_per_token)
                          if ClipAdam.supports(trainer) else None)
        if update[0] is not None:
            update[0](num_tokens)
        else:
            clip_global(params, float(clip_threshold(num_tokens, clip_per_token)))  # per token: a sync
            trainer.step(num_tokens)
        return l.sum(), num_tokens  # stay on the device

    step.health = lambda: update[0].health() if update and update[0] is not None else None
    return step


def _parallel_step(model, trainer, loss, ctxs, fast, global_tokens, clip_per_token=False,
                   precision="float32", static=True):
    """Data parallelism: the same step as on one device, on several at once.

    The batch is split across ``ctxs`` (`gluon.utils.split_and_load`); every device runs the
    forward and backward passes on its part (the hybridized `TrainGraph` with ``fast``);
    ``trainer.allreduce_grads()`` sums the gradients over the devices and, with a dist kvstore,
    over all workers, and leaves the sum on every device; each device clips that same sum by
    its global norm (so all copies stay equal); ``trainer.update`` divides by the global token
    count. With the same weights and batches the update equals the single-device one on the
    whole batch (tests/test_distributed.py, 1e-5). The first step broadcasts the first device's
    (rank 0's) weights before its forward pass (`_gluon.init_kvstore`), not after it as Gluon would.
    """
    params = [p for p in model.collect_params().values() if p.grad_req != "null"]
    update = []  # the ClipAdam, built after the first allreduce (the kvstore exists then)
    if fast:
        graph = _graph(model, loss, precision, static)
    else:
        def graph(X, X_vlen, Y_input, Y_label, Y_vlen):
            return loss(model(X, Y_input, X_vlen, Y_vlen)[0], Y_label, Y_vlen)

    def step(X, X_vlen, Y_input, Y_label, Y_vlen):
        used = ctxs[:min(len(ctxs), X.shape[0])]  # a last batch smaller than the device count
        parts = [gluon.utils.split_and_load(a, used, even_split=False)
                 for a in (X, X_vlen, Y_input, Y_label, Y_vlen)]
        if _gluon.deferred(params):  # deferred init in the faithful order
            model(*(parts[i][0] for i in (0, 2, 1, 4)))
        if not update:  # first step: rank 0's weights everywhere before the forward pass
            _gluon.init_kvstore(trainer)
        with autograd.record(), kernels.fused(used):
            losses = [graph(*part) for part in zip(*parts)]  # (batch_i,) per device
        autograd.backward(losses)
        for c in ctxs[len(used):]:  # devices without data add nothing to the sum
            for p in params:
                p.grad(c)[:] = 0
                p.data(c)._fresh_grad = True  # and are updated like the others
        trainer.allreduce_grads()  # every device now holds the sum over devices and workers
        num_tokens = float(Y_vlen.sum())
        if not update:  # fused clip + Adam on every device (`ClipAdam`) when it applies
            update.append(ClipAdam(trainer, params, CLIP_THETA, ctxs, per_token=clip_per_token)
                          if fast and ClipAdam.supports(trainer) else None)
        total = global_tokens(num_tokens)[0]
        if update[0] is not None:
            update[0](total)
        else:
            clip_global(params, clip_threshold(total, clip_per_token), ctxs)
            trainer.update(total)
        return sum(float(l.sum()) for l in losses), num_tokens

    step.health = lambda: update[0].health() if update and update[0] is not None else None
    return step
