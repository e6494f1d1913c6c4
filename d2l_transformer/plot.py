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
