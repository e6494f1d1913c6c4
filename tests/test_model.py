"""9.3.5-9.3.6: encoder and decoder, against the book's code; the three chapter bugs; caching."""

import chapter_0_11 as book
import numpy as onp
import pytest
from conftest import ModelGraph, assert_close, copy_params
from mxnet import autograd, np

import d2l_transformer as d2t
from d2l_transformer.config import BUGS, EDITIONS, EXACT_BUGS


def test_toy_shapes():
    X, vl = np.ones((2, 100, 24)), np.array([2, 3])
    encoder_blk = d2t.EncoderBlock(24, 48, 8, 0.5)
    encoder_blk.initialize()
    assert encoder_blk(X, vl).shape == (2, 100, 24)
    encoder = d2t.TransformerEncoder(200, 24, 48, 8, 2, 0.5)
    encoder.initialize()
    assert encoder(np.ones((2, 100)), vl).shape == (2, 100, 24)
    decoder_blk = d2t.DecoderBlock(24, 48, 8, 0.5, 0)
    decoder_blk.initialize()
    state = [encoder_blk(X, vl), vl, [None]]
    out, state = decoder_blk(X, state)
    assert out.shape == (2, 100, 24) and state[2][0].shape == (2, 100, 24)
    assert list(decoder_blk._children) == ["attention_1", "addnorm_1", "attention_2", "addnorm_2",
                                           "ffn", "addnorm_3"]


V_SRC, V_TGT, D, FFN, HEADS, LAYERS = 30, 20, 16, 32, 4, 2


def _models(exact, v_tgt=V_TGT):
    """Ours and the book's encoder-decoder with identical weights."""
    cfg = d2t.TINY.replace(embedding_size=D, ffn_hidden_size=FFN, num_heads=HEADS,
                           num_layers=LAYERS, dropout=0.0, exact_chapter=exact)
    ours = d2t.build_model(cfg, V_SRC, v_tgt)
    vocab_out = V_SRC if exact else v_tgt
    theirs = d2t.EncoderDecoder(book.TransformerEncoder(V_SRC, D, FFN, HEADS, LAYERS, 0.0),
                                book.TransformerDecoder(vocab_out, D, FFN, HEADS, LAYERS, 0.0))
    X, Y, xl, yl = _batch()
    for m in (ours, theirs):
        m.initialize()
        m(X, Y, xl, yl)
    copy_params(theirs, ours)
    return ours, theirs


def _batch():
    X = np.array(onp.random.RandomState(1).randint(0, V_SRC, size=(3, 6)))
    Y = np.array(onp.random.RandomState(2).randint(0, V_TGT, size=(3, 5)))
    return X, Y, np.array([6, 2, 4]), np.array([5, 3, 1])


def test_exact_mode_equals_the_book_in_training():
    ours, theirs = _models(exact=True)
    X, Y, xl, yl = _batch()
    with autograd.record():
        a, _ = ours(X, Y, xl, yl)
        b, _ = theirs(X, Y, xl, yl)
    assert_close(a, b, tol=0)


def test_bug1_exact_decoder_has_source_vocabulary_size():
    exact, _ = _models(exact=True)
    fixed, _ = _models(exact=False)
    assert exact.decoder.dense.weight.shape[0] == V_SRC
    assert fixed.decoder.dense.weight.shape[0] == V_TGT


def _incremental(model, X, xl, Y):
    """Feed the target one token at a time through the cached state, as prediction does."""
    enc = model.encoder(X, xl)
    state = model.decoder.init_state(enc, xl)
    outs = []
    for t in range(Y.shape[1]):
        out, state = model.decoder(Y[:, t:t + 1], state)
        outs.append(out)
    return np.concatenate(outs, axis=1), state


def test_bug3_exact_mode_restarts_positions_like_the_book():
    ours, theirs = _models(exact=True)
    X, Y, xl, _ = _batch()
    a, _ = _incremental(ours, X, xl, Y)
    b, _ = _incremental(theirs, X, xl, Y)
    assert_close(a, b, tol=0)
    with autograd.record():  # training sees positions 0, 1, 2, ...: not what prediction saw
        full, _ = ours(X, Y, xl, np.array([5, 5, 5]))
    assert not onp.allclose(a.asnumpy(), full.asnumpy(), atol=1e-3)


def test_incremental_decoding_equals_one_causal_forward():
    ours, _ = _models(exact=False)
    X, Y, xl, _ = _batch()
    inc, state = _incremental(ours, X, xl, Y)
    full, _ = ours(X, Y, xl)  # eval mode: the corrected decoder is causal anyway
    assert_close(inc, full, tol=1e-5)
    assert state[2][0].shape == (3, 5, D) and len(state[2]) == LAYERS


def test_causality_future_tokens_do_not_change_earlier_outputs():
    ours, _ = _models(exact=False)
    X, Y, xl, _ = _batch()
    Y2 = Y.copy()
    Y2[:, 3:] = (Y2[:, 3:] + 1) % V_TGT
    a, _ = ours(X, Y, xl)
    b, _ = ours(X, Y2, xl)
    assert_close(a[:, :3], b[:, :3], tol=1e-6)
    assert not onp.allclose(a[:, 3:].asnumpy(), b[:, 3:].asnumpy())


def test_fixes_change_nothing_else():
    """One example, equal vocabularies, no cache: no bug can show, so fixed == the book."""
    ours, theirs = _models(exact=False, v_tgt=V_SRC)
    X, Y, xl, yl = _batch()
    with autograd.record():
        a, _ = ours(X[:1], Y[:1], xl[:1], yl[:1])
        b, _ = theirs(X[:1], Y[:1], xl[:1], yl[:1])
    assert_close(a, b, tol=1e-6)


def test_hybridized_model_equals_imperative():
    ours, _ = _models(exact=False)
    X, Y, xl, _ = _batch()
    expected, _ = ours(X, Y, xl)
    graph = ModelGraph(ours)
    graph.hybridize(static_alloc=True, static_shape=True)
    for _ in range(2):  # the first call traces the graph, the second reuses it
        assert_close(graph(X, Y, xl), expected, tol=1e-5)


@pytest.mark.parametrize("edition", ["0.11", "0.17", "1.0"])
def test_each_bug_is_a_named_switch_set_at_construction(edition):
    """`config.EXACT_BUGS` alone decides which switches an exact model's blocks have on; the
    corrected model has none; every switch is the block's own attribute from its __init__."""
    assert set(EXACT_BUGS[edition]) <= set(BUGS)
    for exact in (True, False):
        cfg = EDITIONS[edition].replace(exact_chapter=exact, embedding_size=8, ffn_hidden_size=16,
                                        num_heads=2, num_layers=2)
        on = set(EXACT_BUGS[edition]) if exact else set()
        assert set(cfg.bugs) == on
        model = d2t.build_model(cfg, V_SRC, V_TGT)
        dec = model.decoder
        attentions = [b.attention for b in model.encoder.blks] + [
            a for b in dec.blks for a in (b.attention_1, b.attention_2)]
        assert {a.tile_valid_lengths for a in attentions} == {"tile_valid_lengths" in on}
        assert {b.mask_in_training_only for b in dec.blks} == {"mask_in_training_only" in on}
        assert dec.restart_positions == ("restart_positions" in on)
        model.initialize()
        X, Y, xl, yl = _batch()
        logits, _ = model(X, Y, xl, yl)
        assert logits.shape[-1] == (V_SRC if "decoder_vocab_from_source" in on else V_TGT)
