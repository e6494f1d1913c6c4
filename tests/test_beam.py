"""Beam search: beam 1 is greedy decoding, beam k never scores worse than greedy."""

import mxnet as mx
import pytest
from mxnet import init

import d2l_transformer as d2t
from d2l_transformer.data import heldout_nmt
from d2l_transformer.inference.beam import beam_search, length_penalty, score_translation

CHAPTER_SENTENCES = ["go .", "i lost .", "he's calm .", "i'm home .", "wow !", "i won !"]


@pytest.fixture(scope="module")
def setup():
    """A TINY model, trained 3 epochs (peaked outputs) and an untrained copy (flat outputs, where
    beam search and greedy disagree), with 30 held-out sentences."""
    d2t.set_seed(0)
    cfg = d2t.TINY.replace(num_epochs=3)
    src_vocab, tgt_vocab, data_iter = d2t.load_data_nmt(cfg.batch_size, cfg.num_steps,
                                                        cfg.num_examples)
    ctx = mx.cpu()
    trained = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    d2t.train_s2s_ch8(trained, data_iter, cfg.lr, cfg.num_epochs, ctx)
    untrained = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    untrained.initialize(init.Xavier(), ctx=ctx)
    held, _ = heldout_nmt(src_vocab, tgt_vocab, cfg.num_examples, 30)["unfiltered"]
    sentences = [s.split(" ") for s in CHAPTER_SENTENCES] + held
    return {"trained": trained, "untrained": untrained}, src_vocab, tgt_vocab, cfg, ctx, sentences


def test_length_penalty():
    assert length_penalty(1, 0.6) == 1.0 and length_penalty(7, 0.6) == pytest.approx(2 ** 0.6)
    assert length_penalty(13, 0.0) == 1.0


@pytest.mark.parametrize("which", ["trained", "untrained"])
def test_beam_one_is_greedy(setup, which):
    models, src_vocab, tgt_vocab, cfg, ctx, sentences = setup
    model = models[which]
    beams = beam_search(model, sentences, src_vocab, tgt_vocab, cfg.num_steps, ctx, beam_size=1)
    for tokens, (out, score) in zip(sentences, beams):
        greedy = d2t.predict_s2s_ch8(model, " ".join(tokens), src_vocab, tgt_vocab, cfg.num_steps, ctx)
        assert " ".join(out) == greedy
        finished = len(out) < cfg.num_steps
        assert score == pytest.approx(score_translation(
            model, tokens, out, src_vocab, tgt_vocab, cfg.num_steps, ctx, finished), abs=1e-4)


@pytest.mark.parametrize("beam_size", [2, 4])
def test_beam_never_scores_worse_than_greedy(setup, beam_size):
    models, src_vocab, tgt_vocab, cfg, ctx, sentences = setup
    model = models["untrained"]
    greedy = beam_search(model, sentences, src_vocab, tgt_vocab, cfg.num_steps, ctx, beam_size=1)
    beams = beam_search(model, sentences, src_vocab, tgt_vocab, cfg.num_steps, ctx,
                        beam_size=beam_size)
    differ = 0
    for tokens, (g_out, _), (b_out, b_score) in zip(sentences, greedy, beams):
        g_score = score_translation(model, tokens, g_out, src_vocab, tgt_vocab, cfg.num_steps, ctx,
                                    finished=len(g_out) < cfg.num_steps)
        assert b_score >= g_score - 1e-5
        differ += b_out != g_out
    assert differ >= 5  # the search does find other, better-scoring translations


def test_batch_equals_one_by_one(setup):
    models, src_vocab, tgt_vocab, cfg, ctx, sentences = setup
    batch = beam_search(models["untrained"], sentences[:8], src_vocab, tgt_vocab, cfg.num_steps, ctx)
    for tokens, (out, score) in zip(sentences[:8], batch):
        (one, one_score), = beam_search(models["untrained"], [tokens], src_vocab, tgt_vocab,
                                        cfg.num_steps, ctx)
        assert one == out and one_score == pytest.approx(score, abs=1e-4)
