"""The chapter's greedy decoding: `predict_s2s_ch8` (d2l 9.3.7) and its loop, `chapter_greedy`."""

from mxnet import np

from ..data import truncate_pad
from .limits import chapter_only
from .translator import Translator


def chapter_greedy(model, src_tokens, src_vocab, tgt_vocab, num_steps, ctx):
    """The chapter's own loop through the decoder's state, exactly as the book runs it: the
    source cut or padded to `num_steps`, at most `num_steps` tokens, the argmax over the whole
    vocabulary. Returns the target tokens (no ``<eos>``). The decoding of a model whose decoder
    restarts its positions (`limits.chapter_only`)."""
    src_ids = src_vocab[list(src_tokens)]
    enc_valid_length = np.array([len(src_ids)], ctx=ctx)
    enc_X = np.array(truncate_pad(src_ids, num_steps, src_vocab["<pad>"]), ctx=ctx)
    enc_outputs = model.encoder(np.expand_dims(enc_X, axis=0), enc_valid_length)  # (1, T, d)
    dec_state = model.decoder.init_state(enc_outputs, enc_valid_length)
    dec_X = np.expand_dims(np.array([tgt_vocab["<bos>"]], ctx=ctx), axis=0)  # (1, 1)
    predict_tokens = []
    for _ in range(num_steps):
        Y, dec_state = model.decoder(dec_X, dec_state)  # Y: (1, 1, vocab)
        dec_X = Y.argmax(axis=2)  # the most likely token is the next input, (1, 1)
        py = dec_X.squeeze(axis=0).astype("int32").item()
        if py == tgt_vocab["<eos>"]:
            break
        predict_tokens.append(py)
    return tgt_vocab.to_tokens(predict_tokens)


def predict_s2s_ch8(model, src_sentence, src_vocab, tgt_vocab, num_steps, ctx):
    """Greedy decoding of one sentence, at most `num_steps` tokens (d2l 9.3.7): a string.

    The sentence is lower-cased and split on spaces. A model only the chapter's loop decodes
    (`limits.chapter_only`: an exact run's, or the book's own classes) runs `chapter_greedy`.
    The corrected model is decoded by the `Translator` (the same greedy tokens, from one key/value-cache step
    graph; the source is never cut), with nothing masked: like the chapter's argmax, it may
    emit any token of the vocabulary.
    """
    tokens = src_sentence.lower().split(" ")
    if chapter_only(model):
        out = chapter_greedy(model, tokens, src_vocab, tgt_vocab, num_steps, ctx)
    else:
        hyp, = Translator(model, src_vocab, tgt_vocab, ctx, num_steps=num_steps,
                          max_length=num_steps, suppress=False).translate([tokens])
        out = hyp.tokens
    return " ".join(out)


def predict_step(model, sources, src_vocab, tgt_vocab, num_steps, ctx):
    """d2l 1.0's ``EncoderDecoder.predict_step`` and the cell around it: the sources (token
    lists) cut or padded to `num_steps` as one batch, exactly `num_steps` steps of the chapter's
    loop through the decoder's state for all of them, each output cut at its first ``<eos>``.
    Returns the target token lists."""
    src = np.array([src_vocab[truncate_pad(list(s), num_steps, "<pad>")] for s in sources],
                   ctx=ctx)  # (n, num_steps)
    src_valid_len = (src != src_vocab["<pad>"]).astype("int32").sum(axis=1)  # (n,)
    dec_state = model.decoder.init_state(model.encoder(src, src_valid_len), src_valid_len)
    dec_X = np.full((len(sources), 1), tgt_vocab["<bos>"], ctx=ctx)  # (n, 1)
    outputs = []
    for _ in range(num_steps):
        Y, dec_state = model.decoder(dec_X, dec_state)  # Y: (n, 1, vocab)
        dec_X = Y.argmax(axis=2)  # (n, 1)
        outputs.append(dec_X)
    rows = np.concatenate(outputs, axis=1).astype("int32").asnumpy().tolist()  # (n, num_steps)
    eos = tgt_vocab["<eos>"]
    return [tgt_vocab.to_tokens(row[:row.index(eos)] if eos in row else row) for row in rows]
