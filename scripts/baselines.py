"""Baselines for scripts/bench.py: the chapter's Transformer (d2l 9.3) trained in PyTorch eager
and in GluonNLP 0.10 hybridized, on the batches the package's rows train on.

Both follow the chapter: post-norm blocks, sinusoidal positions added to the embeddings scaled
by sqrt(d), no biases in the attention projections, masked softmax over the valid lengths (the
decoder's self-attention causal), ``MaskedSoftmaxCELoss`` (per sentence: the mean over the
padded width, ``reduction="book"``, or the sum over its tokens, ``"token"``; with label
smoothing when the config has it), the gradient of the summed loss clipped to global norm 1,
then Adam on it divided by the number of target tokens (``trainer.step(num_tokens)``).

``batches``: ``[(X, X_valid_len, Y, Y_valid_len), ...]`` NumPy arrays as the package's loaders
give them; the decoder reads ``Y[:, :-1]`` and predicts ``Y[:, 1:]`` with ``Y_valid_len - 1``
target tokens, the tokens a row counts. ``epochs`` passes over them, the first one warm-up:
the value is target tokens/s over the others. Imported by bench.py only.
"""

import math
import time


def missing(package):
    """None when `package` imports, else a one-line reason to skip its row."""
    try:
        __import__(package)
    except ImportError:
        how = {"torch": "pip install torch (its CPU wheel)",
               "gluonnlp": "pip install gluonnlp==0.10.0 (the test extra)"}[package]
        return f"{package} is not installed: {how}"
    return None


def _rate(batches, tokens, epochs, step, read=float):
    """Target tokens/s of `step(*batch)` over passes 2..`epochs` (pass 1: warm-up), `tokens`
    target tokens a pass; and the last pass's loss per token (`step` gives its batch's summed
    loss; `read` turns a pass's sum into a float, waiting for the pass's device work)."""
    stamps, loss = [], 0.0
    for _ in range(epochs):
        loss = read(sum(step(*batch) for batch in batches))
        stamps.append(time.time())
    return tokens * (len(stamps) - 1) / (stamps[-1] - stamps[0]), {
        "loss": loss / tokens, "epochs_timed": len(stamps) - 1}


def _tokens(batches):
    """The target tokens of `batches` as the package's rows count them: sum(Y_valid_len - 1)."""
    return sum(float((Y_len - 1).sum()) for *_, Y_len in batches)


# ---------------------------------------------------------------- PyTorch eager
def _torch_model(cfg, src_size, tgt_size):
    """The chapter's EncoderDecoder in PyTorch (9.3.1-9.3.6)."""
    import torch
    from torch import nn

    d, h = cfg.embedding_size, cfg.num_heads

    class MultiHeadAttention(nn.Module):  # 9.3.1
        def __init__(self):
            super().__init__()
            self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d, d, bias=False) for _ in "qkvo")
            self.dropout = nn.Dropout(cfg.dropout)

        def forward(self, query, key, value, mask):
            """query: (b, q, d); key, value: (b, k, d); mask: (b | 1, q | 1, k), True: seen."""
            b = query.shape[0]
            Q = self.W_q(query).view(b, -1, h, d // h).transpose(1, 2)  # (b, h, q, d/h)
            K = self.W_k(key).view(b, -1, h, d // h).transpose(1, 2)  # (b, h, k, d/h)
            V = self.W_v(value).view(b, -1, h, d // h).transpose(1, 2)  # (b, h, k, d/h)
            scores = Q @ K.transpose(2, 3) / math.sqrt(d // h)  # (b, h, q, k)
            scores = scores.masked_fill(~mask.unsqueeze(1), -1e6)  # d2l's masked_softmax
            out = self.dropout(torch.softmax(scores, dim=-1)) @ V  # (b, h, q, d/h)
            return self.W_o(out.transpose(1, 2).reshape(b, -1, d))  # (b, q, d)

    class AddNorm(nn.Module):  # 9.3.3
        def __init__(self):
            super().__init__()
            self.dropout, self.norm = nn.Dropout(cfg.dropout), nn.LayerNorm(d)

        def forward(self, X, Y):
            return self.norm(self.dropout(Y) + X)

    def ffn():  # 9.3.2
        return nn.Sequential(nn.Linear(d, cfg.ffn_hidden_size), nn.ReLU(),
                             nn.Linear(cfg.ffn_hidden_size, d))

    class Block(nn.Module):  # 9.3.5 / 9.3.6: an encoder block, or a decoder block with `cross`
        def __init__(self, cross):
            super().__init__()
            self.attention_1, self.addnorm_1 = MultiHeadAttention(), AddNorm()
            if cross:
                self.attention_2, self.addnorm_2 = MultiHeadAttention(), AddNorm()
            self.cross, self.ffn, self.addnorm_3 = cross, ffn(), AddNorm()

        def forward(self, X, mask, enc_outputs=None, enc_mask=None):
            Y = self.addnorm_1(X, self.attention_1(X, X, X, mask))
            if self.cross:
                Y = self.addnorm_2(Y, self.attention_2(Y, enc_outputs, enc_outputs, enc_mask))
            return self.addnorm_3(Y, self.ffn(Y))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.src_embed, self.tgt_embed = nn.Embedding(src_size, d), nn.Embedding(tgt_size, d)
            X = torch.arange(1000.0).view(-1, 1) / 10000 ** (torch.arange(0, d, 2) / d)
            P = torch.zeros(1, 1000, d)  # 9.3.4: (1, max_len, d)
            P[:, :, 0::2], P[:, :, 1::2] = torch.sin(X), torch.cos(X)
            self.register_buffer("P", P)
            self.dropout = nn.Dropout(cfg.dropout)
            self.enc = nn.ModuleList(Block(False) for _ in range(cfg.num_layers))
            self.dec = nn.ModuleList(Block(True) for _ in range(cfg.num_layers))
            self.dense = nn.Linear(d, tgt_size)

        def embed(self, embedding, X):  # (b, T) -> (b, T, d)
            return self.dropout(embedding(X) * math.sqrt(d) + self.P[:, :X.shape[1]])

        def forward(self, X, X_valid_len, Y):
            """X: (b, k), X_valid_len: (b,), Y: (b, q) -> logits (b, q, tgt_size)."""
            k, q = X.shape[1], Y.shape[1]
            enc_mask = (torch.arange(k) < X_valid_len.view(-1, 1)).unsqueeze(1)  # (b, 1, k)
            causal = torch.ones(q, q, dtype=torch.bool).tril().unsqueeze(0)  # (1, q, q)
            H = self.embed(self.src_embed, X)
            for blk in self.enc:
                H = blk(H, enc_mask)
            S = self.embed(self.tgt_embed, Y)
            for blk in self.dec:
                S = blk(S, causal, H, enc_mask)
            return self.dense(S)

    model = Transformer()
    for p in model.parameters():  # MXNet's Xavier (uniform, avg) on the weights
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return model


def train_torch(batches, src_size, tgt_size, cfg, epochs, threads, autocast=False):
    """PyTorch eager on `threads` threads (None: PyTorch's own choice): (target tokens/s,
    extra). ``autocast``: the forward pass under ``torch.autocast("cpu", dtype=torch.bfloat16)``
    (PyTorch's mixed precision: its products in bfloat16, float32 weights and optimizer), the
    loss on float32 logits."""
    import contextlib

    import torch
    import torch.nn.functional as F

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = _torch_model(cfg, src_size, tgt_size)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                           eps=cfg.epsilon)
    warmup = cfg.warmup_steps  # the paper's schedule (`optim.WarmupInverseSqrt`), or none
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: min(
        (t + 1) / warmup, math.sqrt(warmup / (t + 1))) if warmup else 1.0)
    params = list(model.parameters())
    data = [[torch.from_numpy(a.astype("int64")) for a in batch] for batch in batches]

    def step(X, X_len, Y, Y_len):
        label, label_len = Y[:, 1:], Y_len - 1  # (b, q), (b,)
        with (torch.autocast("cpu", dtype=torch.bfloat16) if autocast
              else contextlib.nullcontext()):
            logits = model(X, X_len, Y[:, :-1]).float()  # (b, q, tgt_size)
        ce = F.cross_entropy(logits.transpose(1, 2), label, reduction="none",
                             label_smoothing=cfg.label_smoothing)  # (b, q)
        ce = ce * (torch.arange(label.shape[1]) < label_len.view(-1, 1))  # (b, q), padding 0
        l = ce.mean(1) if cfg.loss_reduction == "book" else ce.sum(1)  # (b,)
        opt.zero_grad()
        l.sum().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)  # the summed loss's gradient (d2l)
        num_tokens = int(label_len.sum())
        torch._foreach_mul_([p.grad for p in params], 1.0 / num_tokens)  # step(num_tokens)
        opt.step()
        sched.step()
        return float(l.detach().sum())

    model.train()
    rate, extra = _rate(data, _tokens(batches), epochs, step)
    return rate, {**extra, "threads": torch.get_num_threads(), "torch": torch.__version__,
                  "autocast": "bfloat16" if autocast else None}


# ---------------------------------------------------------------- GluonNLP 0.10, hybridized
def train_gluonnlp(batches, src_size, tgt_size, cfg, epochs):
    """GluonNLP 0.10's TransformerEncoder / TransformerDecoder (no input LayerNorm, as the
    chapter), hybridized with d2l's loss; MXNet's legacy arrays: (target tokens/s, extra)."""
    import gluonnlp
    import mxnet as mx
    from gluonnlp.model.transformer import TransformerDecoder, TransformerEncoder
    from mxnet import gluon, init
    from mxnet.gluon import nn

    sizes = dict(num_layers=cfg.num_layers, units=cfg.embedding_size, num_heads=cfg.num_heads,
                 hidden_size=cfg.ffn_hidden_size, dropout=cfg.dropout, norm_inputs=False,
                 max_length=max(b[0].shape[1] for b in batches))

    class Transformer(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.src_embed = nn.Embedding(src_size, cfg.embedding_size)
                self.tgt_embed = nn.Embedding(tgt_size, cfg.embedding_size)
                self.encoder = TransformerEncoder(**sizes)  # scales by sqrt(d), adds positions
                self.decoder = TransformerDecoder(**sizes)
                self.dense = nn.Dense(tgt_size, flatten=False)

        def hybrid_forward(self, F, X, X_valid_len, Y):
            """X: (b, k), X_valid_len: (b,), Y: (b, q) -> logits (b, q, tgt_size)."""
            H, _ = self.encoder(self.src_embed(X), None, X_valid_len)  # (b, k, d)
            steps = F.contrib.arange_like(X, axis=1)  # (k,)
            mem_mask = F.broadcast_lesser(steps.reshape((1, -1)),
                                          X_valid_len.reshape((-1, 1)))  # (b, k)
            S, _, _ = self.decoder(self.tgt_embed(Y), [H, mem_mask])  # causal: (b, q, d)
            return self.dense(S)

    class MaskedSoftmaxCELoss(gluon.loss.SoftmaxCELoss):  # 9.3.7, in legacy operators
        def hybrid_forward(self, F, pred, label, valid_len):
            weights = F.expand_dims(F.ones_like(label), axis=-1)  # (b, q, 1)
            weights = F.SequenceMask(weights, valid_len, use_sequence_length=True, axis=1)
            return super().hybrid_forward(F, pred, label, weights)  # (b,)

    with mx.util.np_array(False), mx.util.np_shape(False):  # gluonnlp's legacy arrays
        mx.random.seed(0)
        model, loss = Transformer(), MaskedSoftmaxCELoss()
        model.initialize(init.Xavier(), ctx=mx.cpu())
        model.hybridize(static_alloc=True, static_shape=True)
        loss.hybridize(static_alloc=True, static_shape=True)
        trainer = gluon.Trainer(model.collect_params(), "adam", {"learning_rate": cfg.lr})
        params = [p for p in model.collect_params().values() if p.grad_req != "null"]
        data = [[mx.nd.array(a) for a in batch] + [float((batch[3] - 1).sum())]
                for batch in batches]

        def step(X, X_len, Y, Y_len, num_tokens):
            with mx.autograd.record():
                l = loss(model(X, X_len, Y[:, :-1]), Y[:, 1:], Y_len - 1)  # (b,)
            l.backward()
            gluon.utils.clip_global_norm([p.grad() for p in params], 1,
                                         check_isfinite=False)  # no host sync
            trainer.step(num_tokens)
            return l.sum()

        rate, extra = _rate(data, _tokens(batches), epochs, step,
                            read=lambda total: total.asscalar())
    return rate, {**extra, "gluonnlp": gluonnlp.__version__}
