"""Figures as PNG files (no screen needed)."""

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402


def plot_positional_encoding(Y, path, dims=(4, 5, 6, 7)):
    """The chapter's figure: columns `dims` of one encoded sequence Y (seq_len, d) over positions."""
    Y = Y.asnumpy() if hasattr(Y, "asnumpy") else Y
    fig, ax = plt.subplots(figsize=(6, 2.5))
    for d in dims:
        ax.plot(range(Y.shape[0]), Y[:, d], label=f"dim {d}")
    ax.set_xlabel("position")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_loss(history, path, num_epochs=None, label=None):
    """The chapter's training curve: loss every 10 epochs. history: [(epoch, loss), ...]."""
    fig, ax = plt.subplots(figsize=(3.5, 2.5))
    ax.plot([e for e, _ in history], [v for _, v in history], label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.set_xlim(1, num_epochs or max((e for e, _ in history), default=1))
    ax.set_ylim(0, 0.25)
    ax.grid(True)
    if label:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def attention_maps(model, src_tokens, tgt_tokens, src_vocab, tgt_vocab, num_steps, ctx):
    """The attention weights of every layer and head for one sentence and its translation.

    Runs the encoder on the source and the decoder once on ``<bos> y_1 ... y_m`` (teacher
    forcing on the given translation), reading each DotProductAttention's `attention_weights`
    (stored on imperative calls). Returns ``{kind: (weights, row_labels, column_labels)}`` for
    kind in ``encoder``, ``decoder``, ``encoder-decoder``; weights: (layers, heads, rows, cols)
    as NumPy arrays. Decoder rows are labelled with the token each position predicts
    (``y_1 ... y_m <eos>``); padding columns are cut off.
    """
    import numpy as onp
    from mxnet import np

    from ..inference.beam import encode

    n, h = len(src_tokens), model.encoder.blks[0].attention.num_heads
    enc_outputs, enc_valid_length = encode(model, [src_tokens], src_vocab, num_steps, ctx)
    enc = [blk.attention.attention.attention_weights.asnumpy() for blk in model.encoder.blks]
    state = model.decoder.init_state(enc_outputs, enc_valid_length)
    dec_in = ["<bos>"] + list(tgt_tokens)
    model.decoder(np.array([tgt_vocab[dec_in]], ctx=ctx), state)  # (1, m + 1) ids
    dec, cross = [], []
    for blk in model.decoder.blks:
        dec.append(blk.attention_1.attention.attention_weights.asnumpy())
        cross.append(blk.attention_2.attention.attention_weights.asnumpy())
    m1 = len(dec_in)
    # each: (batch * heads, queries, keys) with batch 1 -> (layers, heads, rows, cols)
    stack = lambda ws, rows, cols: onp.stack([w.reshape(h, w.shape[-2], w.shape[-1])[:, :rows, :cols]
                                               for w in ws])
    rows_out = list(tgt_tokens) + ["<eos>"]
    return {"encoder": (stack(enc, n, n), list(src_tokens), list(src_tokens)),
            "decoder": (stack(dec, m1, m1), rows_out, dec_in),
            "encoder-decoder": (stack(cross, m1, n), rows_out, list(src_tokens))}


def plot_attention(weights, row_labels, col_labels, path, title=""):
    """A grid of heatmaps, one row of panels per layer and one column per head, with token-
    labelled axes (keys along x, queries along y). weights: (layers, heads, rows, cols)."""
    num_layers, num_heads = weights.shape[:2]
    fig, axes = plt.subplots(num_layers, num_heads, squeeze=False,
                             figsize=(1.0 + 1.8 * num_heads, 0.6 + 1.8 * num_layers))
    for i in range(num_layers):
        for j in range(num_heads):
            ax = axes[i, j]
            ax.imshow(weights[i, j], cmap="Reds", vmin=0, vmax=1)
            ax.set_xticks(range(len(col_labels)))
            ax.set_xticklabels(col_labels, rotation=90, fontsize=7)
            ax.set_yticks(range(len(row_labels)))
            ax.set_yticklabels(row_labels, fontsize=7)
            ax.set_title(f"layer {i + 1}, head {j + 1}", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_attention_maps(model, src_tokens, tgt_tokens, src_vocab, tgt_vocab, num_steps, ctx,
                        out_dir):
    """The three heatmap PNGs for one sentence in `out_dir`; returns their paths."""
    import os

    os.makedirs(out_dir, exist_ok=True)
    maps = attention_maps(model, src_tokens, tgt_tokens, src_vocab, tgt_vocab, num_steps, ctx)
    sentence = f"{' '.join(src_tokens)} => {' '.join(tgt_tokens)}"
    return [plot_attention(w, rows, cols, os.path.join(out_dir, f"attention_{kind}.png"),
                           f"{kind} attention: {sentence}")
            for kind, (w, rows, cols) in maps.items()]
