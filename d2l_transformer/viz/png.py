"""Figures as PNG files (no screen needed)."""

import statistics

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402

from ..report.claim import seconds_per_epoch  # noqa: E402


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


def plot_losses(epoch_history, path, marks=None):
    """d2l 1.0's figure: training and validation loss per epoch. epoch_history: [(epoch, train,
    valid), ...]; ``marks``: ``{label: loss}`` drawn as points at the last epoch (the book's)."""
    epochs = [e for e, _, _ in epoch_history]
    fig, ax = plt.subplots(figsize=(3.5, 2.5))
    ax.plot(epochs, [t for _, t, _ in epoch_history], label="train_loss")
    ax.plot(epochs, [v for _, _, v in epoch_history], "--", label="val_loss")
    for (label, loss), marker in zip((marks or {}).items(), "ox"):
        ax.plot([epochs[-1]], [loss], marker, color="black", label=label)
    ax.set_xlabel("epoch")
    ax.set_xlim(0, epochs[-1])
    ax.grid(True)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def attention_maps(model, src_tokens, tgt_tokens, src_vocab, tgt_vocab, num_steps, ctx):
    """The attention weights of every layer and head for one sentence and its translation.

    From `Translator.attention` (one teacher-forced pass over ``<bos> y_1 ... y_m``). Returns
    ``{kind: (weights, row_labels, column_labels)}`` for kind in ``encoder``, ``decoder``,
    ``encoder-decoder``; weights: (layers, heads, rows, cols) as NumPy arrays. Decoder rows are
    labelled with the token each position predicts (``y_1 ... y_m <eos>``).
    """
    import numpy as onp

    from ..inference.translator import Translator

    att = Translator(model, src_vocab, tgt_vocab, ctx, num_steps=num_steps).attention(
        src_tokens, tgt_tokens)
    return {"encoder": (onp.array(att["encoder"]), att["src_tokens"], att["src_tokens"]),
            "decoder": (onp.array(att["decoder"]), att["out_tokens"], att["tgt_tokens"]),
            "encoder-decoder": (onp.array(att["cross"]), att["out_tokens"], att["src_tokens"])}


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


def plot_validation(curves, path, targets=()):
    """Valid BLEU against minutes of training, one line per run: ``curves`` is
    ``{label: [(epoch, minutes, bleu), ...]}`` (`validation_curve` of each run's summary.json);
    ``targets``: ``[(minutes, bleu, label)]`` drawn as points to reach."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for label, points in curves.items():
        ax.plot([m for _, m, _ in points], [b for _, _, b in points], marker="o", ms=3,
                label=label)
    for minutes, bleu, label in targets:
        ax.plot([minutes], [bleu], marker="x", color="black", ms=8)
        ax.annotate(label, (minutes, bleu), textcoords="offset points", xytext=(4, -10),
                    fontsize=7)
    ax.set_xlabel("minutes of training (validation excluded)")
    ax.set_ylabel("valid BLEU (greedy)")
    ax.grid(True)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def validation_curve(summary):
    """``[(epoch, minutes, valid BLEU), ...]`` of a run's summary (summary.json's
    ``validation`` records: each has the training seconds before it)."""
    return [(r["epoch"], r["train_seconds"] / 60, r["valid_bleu"])
            for r in summary.get("validation", [])]


def plot_claim(groups, path, names):
    """9.3.7's claim as curves: loss against epoch (left) and against seconds (right), one row
    per code (the book's, the package's), one line per model, the median over the seeds with
    their range as a band. groups: ``{(architecture, code): [summary, ...]}``
    (`claim.group`); names: ``{architecture: label}``."""
    codes = sorted({code for _, code in groups}, reverse=True)
    fig, axes = plt.subplots(len(codes), 2, figsize=(9, 3 * len(codes)), squeeze=False)
    for row, code in zip(axes, codes):
        for architecture, label in names.items():
            summaries = groups.get((architecture, code))
            if not summaries:
                continue
            epochs = min(len(s["epoch_history"]) for s in summaries)
            losses = list(zip(*[[h[1] for h in s["epoch_history"][:epochs]] for s in summaries]))
            mid = [statistics.median(col) for col in losses]  # each epoch's, over the seeds
            low, high = [min(col) for col in losses], [max(col) for col in losses]
            per_epoch = statistics.median(seconds_per_epoch(s) for s in summaries)
            x_epoch = list(range(1, epochs + 1))
            x_seconds = [e * per_epoch for e in x_epoch]
            for ax, x in ((row[0], x_epoch), (row[1], x_seconds)):
                line, = ax.plot(x, mid, label=label)
                ax.fill_between(x, low, high, color=line.get_color(), alpha=0.25)
        for ax, xlabel in zip(row, ("epoch", "seconds (median s/epoch x epoch)")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("loss")
            ax.set_title(code)
        row[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
