"""8.14, 9.1, 9.2: the book's seq2seq models (`d2l_transformer.seq2seq`, `.seq2seq_attention`).

Against d2l 0.11.4's library (`Seq2SeqEncoder`, `Seq2SeqDecoder`, `MLPAttention`) and the
section's own `Seq2SeqAttentionDecoder` (oracles/chapter_9_2.py), given the same weights: the
same outputs and states to the bit, in training mode (dropout drawn from the same seed) and step
by step; the toy shapes the sections print; and the two flaws of the book's models, kept.
"""

import mxnet as mx
import numpy as onp
import pytest
from conftest import copy_params
from mxnet import autograd, init, np

from d2l_transformer.model import EncoderDecoder
from d2l_transformer.seq2seq import Seq2SeqDecoder, Seq2SeqEncoder
from d2l_transformer.seq2seq_attention import MLPAttention, Seq2SeqAttentionDecoder

VOCAB, EMBED, HIDDENS, LAYERS = 10, 8, 16, 2  # the sections' toy sizes
PAD = 1


def _book_installed():
    try:
        import d2l
    except ImportError:
        return False
    return d2l.__version__ == "0.11.4"


needs_book = pytest.mark.skipif(not _book_installed(),
                                reason="the book's library d2l==0.11.4 is not installed")


def _book():
    """d2l 0.11.4 and the section's own code (imported only where the library is installed)."""
    import chapter_9_2
    import d2l
    return d2l, chapter_9_2


def _equal(a, b):
    """The same shape and the same numbers, to the bit."""
    a, b = a.asnumpy(), b.asnumpy()
    assert a.shape == b.shape and onp.array_equal(a, b), onp.abs(a - b).max()


def _states_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        _states_equal(x, y) if isinstance(x, (list, tuple)) else _equal(x, y)


def _batch():
    """Token ids (4, 7) with <pad> after each row's valid length (7, 5, 3, 1)."""
    valid_length = np.array([7, 5, 3, 1])
    X = np.random.randint(2, VOCAB, size=(4, 7)).astype("float32")
    return np.where(np.arange(7) < valid_length.reshape(-1, 1), X, PAD), valid_length


def _run(block, *args, training=True, seed=7):
    """One call in training (or prediction) mode, the dropout drawn after ``mx.random.seed``."""
    mx.random.seed(seed)
    with autograd.train_mode() if training else autograd.predict_mode():
        return block(*args)


def _pair(ours, theirs, call):
    """Initialise both, run ``call(block)`` once on each (deferred shapes), give theirs ours."""
    for block in (ours, theirs):
        block.initialize(init.Xavier())
        call(block)
    copy_params(ours, theirs)
    return ours, theirs


def _encoders(dropout=0.0):
    d2l, _ = _book()
    X, valid_length = _batch()
    return _pair(Seq2SeqEncoder(VOCAB, EMBED, HIDDENS, LAYERS, dropout, state_after_padding=True),
                 d2l.Seq2SeqEncoder(VOCAB, EMBED, HIDDENS, LAYERS, dropout),
                 lambda enc: enc(X, valid_length))


# 8.14 -----------------------------------------------------------------------------------------

def test_the_seq2seq_toy_shapes():
    """8.14's toy cells: the encoder's output (7, 4, 16) and state, the decoder's (4, 7, 10)."""
    encoder = Seq2SeqEncoder(vocab_size=10, embed_size=8, num_hiddens=16, num_layers=2)
    encoder.initialize()
    X = np.zeros((4, 7))
    output, state = encoder(X)
    assert output.shape == (7, 4, 16)
    assert (len(state), state[0].shape, state[1].shape) == (2, (2, 4, 16), (2, 4, 16))
    decoder = Seq2SeqDecoder(vocab_size=10, embed_size=8, num_hiddens=16, num_layers=2)
    decoder.initialize()
    out, state = decoder(X, decoder.init_state(encoder(X)))
    assert (out.shape, len(state), state[0].shape, state[1].shape) == \
        ((4, 7, 10), 2, (2, 4, 16), (2, 4, 16))


@needs_book
@pytest.mark.parametrize("training", [True, False])
def test_the_encoder_and_decoder_equal_d2ls(training):
    d2l, _ = _book()
    X, valid_length = _batch()
    ours, theirs = _encoders(dropout=0.2)
    enc_ours, enc_theirs = (_run(e, X, valid_length, training=training) for e in (ours, theirs))
    _equal(enc_ours[0], enc_theirs[0])
    _states_equal(enc_ours[1], enc_theirs[1])
    dec_ours, dec_theirs = _pair(Seq2SeqDecoder(VOCAB, EMBED, HIDDENS, LAYERS, 0.2),
                                 d2l.Seq2SeqDecoder(VOCAB, EMBED, HIDDENS, LAYERS, 0.2),
                                 lambda dec: dec(X, dec.init_state(enc_ours)))
    (Y_ours, state_ours), (Y_theirs, state_theirs) = (
        _run(dec, X, dec.init_state(enc, valid_length), training=training)
        for dec, enc in ((dec_ours, enc_ours), (dec_theirs, enc_theirs)))
    _equal(Y_ours, Y_theirs)
    _states_equal(state_ours, state_theirs)


def _step_by_step(decoder, state, first, num_steps=7):
    """The book's prediction loop, batched: feed each step's argmax back -> the logits."""
    dec_X, outputs = first, []
    with autograd.predict_mode():
        for _ in range(num_steps):
            Y, state = decoder(dec_X, state)
            dec_X = Y.argmax(axis=2)
            outputs.append(Y)
    return np.concatenate(outputs, axis=1), state


@needs_book
def test_the_decoder_step_by_step_equals_d2ls_and_its_own_whole_call():
    d2l, _ = _book()
    X, valid_length = _batch()
    enc, _ = _encoders()
    enc_outputs = _run(enc, X, valid_length, training=False)
    ours, theirs = _pair(Seq2SeqDecoder(VOCAB, EMBED, HIDDENS, LAYERS),
                         d2l.Seq2SeqDecoder(VOCAB, EMBED, HIDDENS, LAYERS),
                         lambda dec: dec(X, dec.init_state(enc_outputs)))
    bos = np.full((4, 1), 2)
    Y_ours, state_ours = _step_by_step(ours, ours.init_state(enc_outputs), bos)
    Y_theirs, state_theirs = _step_by_step(theirs, theirs.init_state(enc_outputs), bos)
    _equal(Y_ours, Y_theirs)
    _states_equal(state_ours, state_theirs)
    fed = Y_ours.argmax(axis=2)[:, :-1].astype("float32")  # what steps 2, 3, ... were fed
    fed = np.concatenate((bos, fed), axis=1)
    _equal(_run(ours, fed, ours.init_state(enc_outputs), training=False)[0], Y_ours)


# 9.1 ------------------------------------------------------------------------------------------

def test_mlp_attentions_toy_output():
    """9.1's toy cell: equal keys give equal weights, so each row averages its valid values."""
    keys = np.ones((2, 10, 2))
    values = np.arange(40).reshape(1, 10, 4).repeat(2, axis=0)
    atten = MLPAttention(units=8, dropout=0.1)
    atten.initialize()
    out = atten(np.ones((2, 1, 2)), keys, values, np.array([2, 6]))
    onp.testing.assert_allclose(out.asnumpy(), [[[2, 3, 4, 5]], [[10, 11, 12, 13]]], rtol=1e-6)


@needs_book
@pytest.mark.parametrize("valid_length", [None, [2, 6], [[1, 2, 3], [4, 5, 6]]])
@pytest.mark.parametrize("training", [True, False])
def test_mlp_attention_equals_d2ls_imperative_and_hybridized(valid_length, training):
    d2l, _ = _book()
    query, key = np.random.normal(size=(2, 3, 5)), np.random.normal(size=(2, 6, 4))
    value = np.random.normal(size=(2, 6, 3))
    v = None if valid_length is None else np.array(valid_length)
    ours, theirs = _pair(MLPAttention(8, 0.3, tanh_before_sum=True), d2l.MLPAttention(8, 0.3),
                         lambda att: att(query, key, value, v))
    expected = _run(theirs, query, key, value, v, training=training)
    _equal(_run(ours, query, key, value, v, training=training), expected)
    ours.hybridize()
    _equal(_run(ours, query, key, value, v, training=training), expected)


# 9.2 ------------------------------------------------------------------------------------------

def test_the_attention_decoders_toy_shapes():
    """9.2's toy cell: the same output shape as 8.14's decoder, a state of three items."""
    encoder = Seq2SeqEncoder(vocab_size=10, embed_size=8, num_hiddens=16, num_layers=2)
    encoder.initialize()
    decoder = Seq2SeqAttentionDecoder(vocab_size=10, embed_size=8, num_hiddens=16, num_layers=2)
    decoder.initialize()
    X = np.zeros((4, 7))
    state = decoder.init_state(encoder(X), None)
    out, state = decoder(X, state)
    assert (out.shape, len(state), state[0].shape, len(state[1]), state[1][0].shape) == \
        ((4, 7, 10), 3, (4, 7, 16), 2, (2, 4, 16))


def _attention_decoders(enc_outputs, valid_length, X, dropout=0.0):
    _, book = _book()
    return _pair(Seq2SeqAttentionDecoder(VOCAB, EMBED, HIDDENS, LAYERS, dropout,
                                         tanh_before_sum=True),
                 book.Seq2SeqAttentionDecoder(VOCAB, EMBED, HIDDENS, LAYERS, dropout),
                 lambda dec: dec(X, dec.init_state(enc_outputs, valid_length)))


@needs_book
@pytest.mark.parametrize("valid_length", [True, None])
def test_the_attention_decoder_equals_the_sections_own_in_training(valid_length):
    X, lengths = _batch()
    valid_length = lengths if valid_length else None
    enc, _ = _encoders()
    enc_outputs = _run(enc, X, valid_length)
    ours, theirs = _attention_decoders(enc_outputs, valid_length, X, dropout=0.2)
    _states_equal(ours.init_state(enc_outputs, valid_length)[:2],
                  theirs.init_state(enc_outputs, valid_length)[:2])
    (Y_ours, state_ours), (Y_theirs, state_theirs) = (
        _run(dec, X, dec.init_state(enc_outputs, valid_length)) for dec in (ours, theirs))
    _equal(Y_ours, Y_theirs)
    _states_equal(state_ours[:2], state_theirs[:2])
    assert state_ours[2] is state_theirs[2] is valid_length


@needs_book
def test_the_attention_decoder_step_by_step_equals_the_sections_own_and_its_whole_call():
    X, valid_length = _batch()
    enc, _ = _encoders()
    enc_outputs = _run(enc, X, valid_length, training=False)
    ours, theirs = _attention_decoders(enc_outputs, valid_length, X)
    bos = np.full((4, 1), 2)
    Y_ours, state_ours = _step_by_step(ours, ours.init_state(enc_outputs, valid_length), bos)
    Y_theirs, state_theirs = _step_by_step(theirs, theirs.init_state(enc_outputs, valid_length), bos)
    _equal(Y_ours, Y_theirs)
    _states_equal(state_ours[:2], state_theirs[:2])
    fed = Y_ours.argmax(axis=2)[:, :-1].astype("float32")
    fed = np.concatenate((bos, fed), axis=1)
    state = ours.init_state(enc_outputs, valid_length)
    _equal(_run(ours, fed, state, training=False)[0], Y_ours)


@needs_book
@pytest.mark.parametrize("attention", [False, True])
def test_the_whole_models_loss_and_gradients_equal_the_books(attention):
    """The training step of `train_s2s_ch9`: model(X, Y, X_vlen, Y_vlen), the masked loss, backward."""
    d2l, book = _book()
    X, X_vlen = _batch()
    Y, Y_vlen = _batch()
    ours_dec, theirs_dec = ((Seq2SeqAttentionDecoder, book.Seq2SeqAttentionDecoder) if attention
                            else (Seq2SeqDecoder, d2l.Seq2SeqDecoder))
    flaw = {"tanh_before_sum": True} if attention else {}
    ours = EncoderDecoder(Seq2SeqEncoder(VOCAB, EMBED, HIDDENS, LAYERS, state_after_padding=True),
                          ours_dec(VOCAB, EMBED, HIDDENS, LAYERS, **flaw))
    theirs = d2l.EncoderDecoder(d2l.Seq2SeqEncoder(VOCAB, EMBED, HIDDENS, LAYERS),
                                theirs_dec(VOCAB, EMBED, HIDDENS, LAYERS))
    ours, theirs = _pair(ours, theirs, lambda m: m(X, Y, X_vlen, Y_vlen))
    loss = d2l.MaskedSoftmaxCELoss()
    losses = []
    for model in (ours, theirs):
        with autograd.record():
            l = loss(model(X, Y, X_vlen, Y_vlen)[0], Y, Y_vlen)
        l.backward()
        losses.append(l)
    _equal(*losses)
    for p, q in zip(ours.collect_params().values(), theirs.collect_params().values()):
        _equal(p.grad(), q.grad())


# The book's flaws, kept by their switches (docs/chapter.md, "The book's seq2seq models")----------------

def test_the_encoder_state_is_the_state_after_the_padding():
    """(a) The encoder ignores the valid lengths: the H it returns is not the last layer's H
    after each row's last real token (its output there), but after the padding that follows."""
    X, valid_length = _batch()
    encoder = Seq2SeqEncoder(VOCAB, EMBED, HIDDENS, LAYERS, state_after_padding=True)
    encoder.initialize(init.Xavier())
    outputs, (H, _) = encoder(X, valid_length)
    last_real = outputs[valid_length - 1, np.arange(4)]  # (batch, num_hiddens)
    gap = np.abs(H[-1] - last_real).max(axis=1).asnumpy()
    assert gap[0] == 0  # the row without padding: the same
    assert (gap[1:] > 1e-3).all(), gap  # every padded row: another state


def test_the_decoder_starts_from_the_state_after_the_padding():
    """(b) The decoder's initial state is the encoder's returned [H, C] itself, so a sentence
    starts the decoder elsewhere when padded to 10 steps than to 7, and the logits move."""
    encoder = Seq2SeqEncoder(VOCAB, EMBED, HIDDENS, LAYERS, state_after_padding=True)
    decoder = Seq2SeqDecoder(VOCAB, EMBED, HIDDENS, LAYERS)
    attention = Seq2SeqAttentionDecoder(VOCAB, EMBED, HIDDENS, LAYERS, tanh_before_sum=True)
    for block in (encoder, decoder, attention):
        block.initialize(init.Xavier())
    valid_length, bos = np.array([3]), np.array([[2]])
    first = {}
    for num_steps in (7, 10):
        X = np.array([[4, 5, 6] + [PAD] * (num_steps - 3)])
        enc_outputs = encoder(X, valid_length)
        assert decoder.init_state(enc_outputs, valid_length) is enc_outputs[1]
        first[num_steps] = [dec(bos, dec.init_state(enc_outputs, valid_length))[0]
                            for dec in (decoder, attention)]
    for Y_7, Y_10 in zip(first[7], first[10]):
        assert np.abs(Y_7 - Y_10).max() > 1e-4


def test_mlp_attentions_weights_do_not_depend_on_the_query():
    """(c) tanh before the sum: the query adds one score to every key, which the softmax
    cancels, so two unrelated queries get the same weights; in 9.2 every step gets the same."""
    attention = MLPAttention(8, 0.0, tanh_before_sum=True)
    attention.initialize(init.Xavier())
    key, value = np.random.normal(size=(2, 6, 4)), np.random.normal(size=(2, 6, 3))
    weights = []
    for scale in (1, 10):
        attention(np.random.normal(size=(2, 3, 5)) * scale, key, value, np.array([4, 6]))
        weights.append(attention.attention_weights.asnumpy())
    onp.testing.assert_allclose(weights[0], weights[1], rtol=0, atol=1e-6)
    assert onp.ptp(weights[0][0, :, :4]) > 0.05  # the keys do move them
    X, valid_length = _batch()
    encoder = Seq2SeqEncoder(VOCAB, EMBED, HIDDENS, LAYERS, state_after_padding=True)
    decoder = Seq2SeqAttentionDecoder(VOCAB, EMBED, HIDDENS, LAYERS, tanh_before_sum=True)
    for block in (encoder, decoder):
        block.initialize(init.Xavier())
    state, steps = decoder.init_state(encoder(X, valid_length), valid_length), []
    for t in range(X.shape[1]):
        _, state = decoder(X[:, t:t + 1], state)
        steps.append(decoder.attention_cell.attention_weights.asnumpy())
    for w in steps[1:]:
        onp.testing.assert_allclose(w, steps[0], rtol=0, atol=1e-6)


# Corrected: the switches off (the default) ------------------------------------------------------

def test_the_corrected_encoder_state_stops_at_the_last_real_token():
    """Off, each row's [H, C] is the state of its sentence alone, whatever padding follows, and
    the outputs of the real steps are the book's; the decoder starts the same at 7 and at 10."""
    X, valid_length = _batch()
    encoder = Seq2SeqEncoder(VOCAB, EMBED, HIDDENS, LAYERS)
    encoder.initialize(init.Xavier())
    outputs, state = encoder(X, valid_length)
    book_outputs, _ = encoder(X)  # no lengths: every step is real, one call of the LSTM
    for row, n in enumerate(valid_length.asnumpy().astype(int)):
        alone_outputs, alone = encoder(X[row:row + 1, :n])  # the sentence without its padding
        for ours, theirs in zip(state, alone):
            onp.testing.assert_allclose(ours[:, row].asnumpy(), theirs[:, 0].asnumpy(), atol=1e-6)
        onp.testing.assert_allclose(outputs[:n, row].asnumpy(), book_outputs[:n, row].asnumpy(),
                                    atol=1e-6)
    decoder = Seq2SeqDecoder(VOCAB, EMBED, HIDDENS, LAYERS)
    decoder.initialize(init.Xavier())
    first = [decoder(np.array([[2]]), decoder.init_state(
        encoder(np.array([[4, 5, 6] + [PAD] * (n - 3)]), np.array([3]))))[0] for n in (7, 10)]
    onp.testing.assert_allclose(first[0].asnumpy(), first[1].asnumpy(), atol=1e-6)


def test_the_corrected_mlp_attention_is_bahdanaus():
    """Off, the scores are v^T tanh(W_k q + W_q k) (the book's crossed names), computed here by
    hand in NumPy, and two queries over the same keys get different weights."""
    attention = MLPAttention(8, 0.0)
    attention.initialize(init.Xavier())
    query, key = np.random.normal(size=(2, 3, 5)), np.random.normal(size=(2, 6, 4))
    value = np.random.normal(size=(2, 6, 3))
    out = attention(query, key, value, np.array([4, 6])).asnumpy()
    Wq, Wk, v = (p.data().asnumpy() for p in (attention.W_k.weight, attention.W_q.weight,
                                              attention.v.weight))
    features = onp.tanh((query.asnumpy() @ Wq.T)[:, :, None] + (key.asnumpy() @ Wk.T)[:, None])
    scores = (features @ v.T)[..., 0]  # (2, 3, 6)
    scores[0, :, 4:] = -onp.inf  # the first example's valid length 4
    weights = onp.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    onp.testing.assert_allclose(out, weights @ value.asnumpy(), rtol=1e-5, atol=1e-6)
    assert onp.ptp(weights[:, :, 0], axis=1).max() > 1e-3  # the queries move the weights
