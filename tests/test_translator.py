"""The translator: beam search (greedy = one beam) over one key/value-cache step graph, against
independent references (tests/decoding_reference.py: the chapter's state, gluonnlp's
BeamSearchSampler); the step against the chapter's full decoder call; its attention weights;
graphs traced again when a block changes."""

import collections
import gc
import weakref

import decoding_reference as reference
import mxnet as mx
import numpy as onp
import pytest
from mxnet import autograd, gluon, init, np

import d2l_transformer as d2t
from d2l_transformer._gluon import graph_json
from d2l_transformer.data import WordTokenizer, heldout_nmt
from d2l_transformer.inference import step as step_module
from d2l_transformer.inference import translator as translator_module
from d2l_transformer.inference.engines import MXNetEngine, no_unk_for, translator_options
from d2l_transformer.inference.limits import ExactChapterError, decode_limit
from d2l_transformer.inference.translator import Translator, length_penalty

CTX = mx.cpu()
CHAPTER_SENTENCES = ["go .", "i lost .", "he's calm .", "i'm home .", "wow !", "i won !"]
CFG = d2t.TINY.replace(num_layers=2)  # two blocks: caches and pruning across layers


@pytest.fixture(scope="module")
def setup():
    """A TINY model with 2 layers trained 30 epochs (peaked outputs) and an untrained one (flat
    outputs, where beam search often finds other translations than greedy), with the chapter's
    sentences and 44 held-out ones."""
    d2t.set_seed(0)
    src_vocab, tgt_vocab, data_iter = d2t.load_data_nmt(CFG.batch_size, CFG.num_steps,
                                                        CFG.num_examples)
    trained = d2t.build_model(CFG, len(src_vocab), len(tgt_vocab))
    d2t.train_s2s_ch8(trained, data_iter, CFG.lr, 30, CTX, fast=True)
    trained.hybridize(False)  # the references decode imperatively
    untrained = d2t.build_model(CFG, len(src_vocab), len(tgt_vocab))
    untrained.initialize(init.Xavier(), ctx=CTX)
    held, _ = heldout_nmt(src_vocab, tgt_vocab, CFG.num_examples, 44)["unfiltered"]
    sentences = [s.split(" ") for s in CHAPTER_SENTENCES] + held
    assert len(sentences) == 50
    return {"trained": trained, "untrained": untrained}, src_vocab, tgt_vocab, sentences


def _translator(model, src_vocab, tgt_vocab, **kwargs):
    """A translator that masks nothing, as the references (the chapter's argmax, gluonnlp's
    sampler) do; the masking of special tokens has its own tests."""
    kwargs.setdefault("max_length", CFG.num_steps)
    kwargs.setdefault("suppress", False)
    return Translator(model, src_vocab, tgt_vocab, CTX, num_steps=CFG.num_steps, **kwargs)


def test_length_penalty():
    assert length_penalty(1, 0.6) == 1.0 and length_penalty(7, 0.6) == pytest.approx(2 ** 0.6)
    assert length_penalty(13, 0.0) == 1.0


@pytest.mark.parametrize("which", ["trained", "untrained"])
def test_beam_one_is_greedy_is_predict_s2s_ch8(setup, which):
    """Greedy (the default) == beam 1 (tokens and scores) == predict_s2s_ch8 == the chapter's
    state decoding one sentence at a time, token for token on 50 sentences; the scores are the
    teacher-forced log-probabilities over the GNMT length penalty."""
    models, src_vocab, tgt_vocab, sentences = setup
    model = models[which]
    translator = _translator(model, src_vocab, tgt_vocab)
    greedy = translator.translate(sentences)
    assert greedy == translator.translate(sentences, beam_size=1)  # tokens and scores
    _same([[h] for h in greedy], [[h] for h in translator.translate(sentences, early_stop=False)])
    assert len({tuple(h.tokens) for h in greedy}) > 5  # non-trivial outputs
    for tokens, hyp in zip(sentences, greedy):
        assert " ".join(hyp.tokens) == d2t.predict_s2s_ch8(model, " ".join(tokens), src_vocab,
                                                            tgt_vocab, CFG.num_steps, CTX)
        assert hyp.tokens == reference.greedy(model, tokens, src_vocab, tgt_vocab,
                                              CFG.num_steps, CTX)
        finished = len(hyp.tokens) < CFG.num_steps
        assert hyp.score == pytest.approx(reference.score(
            model, tokens, hyp.tokens, src_vocab, tgt_vocab, CFG.num_steps, CTX, finished),
            abs=1e-5)


@pytest.mark.parametrize("which", ["trained", "untrained"])
@pytest.mark.parametrize("beam_size", [2, 4])
def test_beam_k_equals_gluonnlp_beam_search_sampler(setup, which, beam_size):
    """The same hypotheses and scores as gluonnlp 0.10's BeamSearchSampler over the chapter's
    state (the former path), on 50 sentences."""
    models, src_vocab, tgt_vocab, sentences = setup
    model = models[which]
    translator = _translator(model, src_vocab, tgt_vocab)
    ours = translator.translate(sentences, beam_size=beam_size)
    ref = reference.beam_search(model, sentences, src_vocab, tgt_vocab, CFG.num_steps, CTX,
                                beam_size=beam_size)
    for hyp, (tokens, score) in zip(ours, ref):
        assert hyp.tokens == tokens
        assert hyp.score == pytest.approx(score, abs=1e-5)
    if which == "untrained":  # flat outputs: the search finds other translations than greedy
        greedy = translator.translate(sentences)
        assert sum(h.tokens != g.tokens for h, g in zip(ours, greedy)) >= 5


def _same(these, those):
    """The same n-best lists token for token, the scores to float rounding (a batch that
    shrinks runs its products on fewer rows, which may sum in another order)."""
    assert [[h.tokens for h in best] for best in these] == \
        [[h.tokens for h in best] for best in those]
    onp.testing.assert_allclose([h.score for best in these for h in best],
                                [h.score for best in those for h in best], rtol=0, atol=1e-5)


@pytest.mark.parametrize("which", ["trained", "untrained"])
def test_finished_sentences_leaving_the_batch_change_nothing(setup, which, monkeypatch):
    """Once half of a batch's sentences have finished, these leave the step's rows: the n-best
    lists of sentences of very different lengths (limits 11 to 22) decoded together equal those
    of each sentence decoded alone (a batch of one never shrinks), greedy and beam search, in
    both early-stop modes; and the batch does shrink (with early stops, where sentences finish
    sooner)."""
    models, src_vocab, tgt_vocab, sentences = setup
    translator = _translator(models[which], src_vocab, tgt_vocab, suppress=True, max_length=None)
    batch = sorted(sentences, key=len)[::3] + [["go", "."] * 6]  # lengths 1 .. 12: limits differ
    rows, call = [], step_module.call

    def spy(graph, *args):
        if isinstance(graph, step_module.DecoderStep):
            rows.append(args[0].shape[0])
        return call(graph, *args)

    monkeypatch.setattr(step_module, "call", spy)
    for k, early_stop in ((1, True), (1, False), (2, True), (4, False)):
        rows.clear()
        together = translator.translate(batch, k, early_stop=early_stop, n_best=k)
        assert min(rows) <= len(batch) * k // 2 or not early_stop, rows  # the batch shrank
        alone = [translator.translate([s], k, early_stop=early_stop, n_best=k)[0]
                 for s in batch]
        _same(together, alone)


def test_settled_bounds_what_a_live_beam_can_still_reach():
    """`_settled` on numbers: beam 0 has finished at -1.0, beam 1 lives after step 5. At
    alpha 0 a live beam only falls; at alpha 1 a live beam at -1.2 may still reach
    -1.2 * lp(5) / lp(20) = -0.48 (above -1.0: not settled), one at -3.0 only -1.2 (settled)."""
    settled = translator_module._settled
    scores = onp.array([[-1.0, -1.2], [-1.0, -3.0], [-1.0, -2.0]], "float32")
    alive = onp.array([[False, True], [False, True], [False, False]])
    limits = onp.array([20, 20, 20])
    assert settled(scores, alive, 5, limits, 0.0, 1).tolist() == [True, True, True]
    assert settled(scores, alive, 5, limits, 1.0, 1).tolist() == [False, True, True]
    assert settled(scores, alive, 5, limits, 0.0, 2).tolist() == [False, False, True]
    assert settled(scores, alive, 5, onp.array([5, 5, 5]), 1.0, 1).all()  # at the limit: no growth
    tie = onp.array([[-1.0, -1.0]], "float32")
    assert not settled(tie, onp.array([[False, True]]), 5, limits[:1], 0.0, 1).any()


@pytest.mark.parametrize("which", ["trained", "untrained"])
def test_a_sentence_stops_once_no_live_beam_can_change_its_n_best(setup, which, monkeypatch):
    """Beam search's early stop per sentence (`_settled`): once its n best beams have finished
    and no live beam can still beat the n-th, a sentence counts as finished. The same n best
    hypotheses (their scores to float rounding: the batch shrinks at other steps) as the
    search run to every limit (early_stop=False) and as the search that waits for every beam
    to finish, at alpha 0 (CTranslate2's stop) and above; and, on the trained model, in fewer
    steps."""
    models, src_vocab, tgt_vocab, sentences = setup
    translator = _translator(models[which], src_vocab, tgt_vocab, suppress=True, max_length=None)
    steps, hypotheses = [], translator_module._Beams.hypotheses

    def count(self):  # the steps the search ran
        steps.append(len(self.words))
        return hypotheses(self)

    monkeypatch.setattr(translator_module._Beams, "hypotheses", count)

    def search(k, alpha, n, early_stop):
        return translator.translate(sentences, k, alpha, early_stop=early_stop, n_best=n)

    fewer = []
    for k, alpha, n in ((2, 0.0, 1), (4, 0.0, 2), (4, 0.6, 1), (3, 1.0, 2), (4, 3.0, 1)):
        settled = search(k, alpha, n, True)
        settled_steps = steps[-1]
        _same(settled, search(k, alpha, n, False))
        with monkeypatch.context() as m:  # the former rule: every beam finished
            m.setattr(translator_module, "_settled",
                      lambda scores, *args: onp.zeros(len(scores), bool))
            _same(settled, search(k, alpha, n, True))
        assert settled_steps <= steps[-1]
        fewer.append(settled_steps < steps[-1])
    assert any(fewer) or which == "untrained", fewer


def test_batches_and_order_do_not_change_a_translation(setup):
    models, src_vocab, tgt_vocab, sentences = setup
    model = models["untrained"]
    together = _translator(model, src_vocab, tgt_vocab, batch_size=7).translate(sentences[:20],
                                                                                beam_size=3)
    alone = _translator(model, src_vocab, tgt_vocab)
    for tokens, hyp in zip(sentences[:20], together):
        one, = alone.translate([tokens], beam_size=3)
        assert one.tokens == hyp.tokens and one.score == pytest.approx(hyp.score, abs=1e-5)
    every = alone.translate(sentences[:20], beam_size=3, early_stop=False)
    assert [h.tokens for h in every] == [h.tokens for h in together]


def test_length_limits_and_bad_arguments(setup):
    models, src_vocab, tgt_vocab, sentences = setup
    model = models["untrained"]
    free = Translator(model, src_vocab, tgt_vocab, CTX, num_steps=10)
    assert free._limit(3) == 13 and free._limit(25) == 35  # max(num_steps, length + 10)
    assert Translator(model, src_vocab, tgt_vocab, CTX, num_steps=30)._limit(3) == 30
    assert all(len(h.tokens) <= 10 for h in _translator(model, src_vocab, tgt_vocab).translate(
        sentences[:10], beam_size=2))
    with pytest.raises(ValueError, match="beam size"):
        free.translate(sentences[:1], beam_size=0)
    with pytest.raises(ValueError, match="positions"):
        free.translate([["go"] * 1001])
    exact_cfg = CFG.replace(exact_chapter=True)
    exact = d2t.build_model(exact_cfg, len(src_vocab), len(tgt_vocab))
    with pytest.raises(ExactChapterError, match="corrected model"):
        Translator(exact, src_vocab, tgt_vocab, CTX)
    exact.initialize(init.Xavier(), ctx=CTX)
    engine = MXNetEngine(exact, src_vocab, tgt_vocab, exact_cfg, WordTokenizer(), CTX)
    with pytest.raises(ExactChapterError, match="^beam search needs the corrected model"):
        engine.translate(sentences[:2], 2)
    with pytest.raises(ExactChapterError, match="^--no-unk needs the corrected model"):
        MXNetEngine(exact, src_vocab, tgt_vocab, exact_cfg, WordTokenizer(), CTX, no_unk=True)
    chapter = [h.tokens for h in engine.translate(sentences[:2])]
    assert chapter == [d2t.predict_s2s_ch8(exact, " ".join(s), src_vocab, tgt_vocab,
                                           CFG.num_steps, CTX).split() for s in sentences[:2]]
    assert free.translate([]) == []


def test_a_short_source_of_a_long_segment_model_cannot_run_on(setup):
    """A model whose lengths were measured on long segments (a 170-token limit, a ratio of
    2.4, as the Bible's English to French) gives a 2-token source at most ceil(2.4 x 2) + 10
    = 15 tokens, even when it never emits <eos>: the data's limit is a ceiling, not a floor.
    The chapter's rule (ratio 0) is unchanged: max(num_steps, source + 10)."""
    models, src_vocab, tgt_vocab, _ = setup
    model = models["untrained"]
    assert decode_limit(170, 2, 1000, 2.4) == 15 and decode_limit(170, 100, 1000, 2.4) == 170
    assert decode_limit(170, 100, 150, 2.4) == 150 and decode_limit(10, 3, None, 0.0) == 13
    bias = model.decoder.dense.bias
    saved = bias.data().copy()
    try:
        never = saved.asnumpy()
        never[tgt_vocab["<eos>"]] = -1e9  # (vocab,): <eos> is never the best token
        bias.set_data(np.array(never, ctx=CTX))
        long = Translator(model, src_vocab, tgt_vocab, CTX, num_steps=170, length_ratio=2.4)
        for beam_size in (1, 3):
            hyps = long.translate([["go", "."], ["i", "lost", "."]], beam_size)
            assert [len(h.tokens) for h in hyps] == [15, 18]  # ceil(2.4 x 3) + 10 = 18
        chapter = Translator(model, src_vocab, tgt_vocab, CTX, num_steps=10)
        assert [len(h.tokens) for h in chapter.translate([["go", "."]])] == [12]
    finally:
        bias.set_data(saved)


def test_encoder_never_truncates_and_pads_to_num_steps(setup):
    models, src_vocab, tgt_vocab, _ = setup
    translator = _translator(models["untrained"], src_vocab, tgt_vocab)
    X, valid = translator.encode_source([["go", "."], ["i"] * 13])
    assert X.shape == (2, 13) and valid.asnumpy().tolist() == [2, 13]
    assert X[0, 2:].asnumpy().tolist() == [src_vocab["<pad>"]] * 11
    X, _ = translator.encode_source([["go", "."]])
    assert X.shape == (1, CFG.num_steps)


@pytest.mark.parametrize("which", ["trained", "untrained"])
def test_padding_each_batch_to_its_longest_source_changes_no_translation(setup, which):
    """``pad_to_num_steps=False`` (subword models, `translator_options`): a batch is padded to
    its longest source, not to num_steps; the encoder masks the padding, so the same tokens
    and the scores to float rounding, greedy and beam 3, on the untrained model's near-ties
    too."""
    models, src_vocab, tgt_vocab, sentences = setup
    short = [s for s in sentences if len(s) <= 4]  # all far below num_steps (10)
    assert len(short) >= 10
    padded = _translator(models[which], src_vocab, tgt_vocab)
    tight = _translator(models[which], src_vocab, tgt_vocab, pad_to_num_steps=False)
    assert tight.encode_source(short)[0].shape == (len(short), max(map(len, short)))
    assert padded.encode_source(short)[0].shape == (len(short), CFG.num_steps)
    for beam in (1, 3):
        a, b = padded.translate(short, beam_size=beam), tight.translate(short, beam_size=beam)
        assert [h.tokens for h in a] == [h.tokens for h in b]
        onp.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-5)
    assert translator_options(CFG)["pad_to_num_steps"]  # the chapter's words: its padding
    assert not translator_options(CFG.replace(tokenizer="subword", vocab_size=100))[
        "pad_to_num_steps"]


@pytest.mark.parametrize("variant", [{}, {"pre_norm": True}, {"fused_qkv": True},
                                     {"pre_norm": True, "norm": "scale", "fixnorm": True}])
def test_cached_step_equals_full_decoding(setup, variant):
    """Step by step through the key/value cache (each step projects only its position), with
    the rows reordered between steps as beams are == the chapter's full decoder call in
    prediction mode on the whole target, at every position of a teacher-forced target: the
    trained model, and the variants (pre-norm, fused QKV, ScaleNorm, FixNorm) untrained. The
    graphs hold MXNet's operators only."""
    models, src_vocab, tgt_vocab, sentences = setup
    model = models["trained"] if not variant else _fresh_model(src_vocab, tgt_vocab, **variant)
    batch = sentences[:8]
    X, valid = _translator(model, src_vocab, tgt_vocab).encode_source(batch)
    T = 7
    Y = np.array(onp.random.RandomState(0).randint(3, len(tgt_vocab), size=(len(batch), T)))
    enc = model.encoder(X, valid)
    full, _ = model.decoder(Y, model.decoder.init_state(enc, valid))  # (batch, T, V)
    full = full.asnumpy()
    encode = step_module.hybridized(step_module.EncoderKV(model))
    step = step_module.hybridized(step_module.DecoderStep(model.decoder, reorder=True))
    kv = step_module.call(encode, X, valid)
    empty = np.zeros((len(batch), T, kv[0].shape[-1]))
    self_kv = [empty] * len(kv)
    order = onp.arange(len(batch))  # the sentence whose history each row holds
    for t in range(T):
        rows = onp.random.RandomState(t).permutation(len(batch))  # row r continues rows[r]
        order = order[rows]
        enc_kv = [x[order] for x in kv]  # the encoder's, as beams carry them
        caches = []
        for i in range(0, len(kv), 2):
            caches += [self_kv[i], self_kv[i + 1], enc_kv[i], enc_kv[i + 1]]
        logits, *self_kv = step_module.call(step, Y[order, t:t + 1], np.array([t]),
                                            valid[order], np.array(rows), *caches)
        onp.testing.assert_allclose(logits.asnumpy(), full[order, t], rtol=1e-5, atol=1e-5)
    for graph in (encode, step):
        assert "d2t_" not in graph_json(graph)


def _chapter_weights(model, X, valid, Y):
    """Each attention's weights from the chapter's imperative calls (stored on the blocks)."""
    enc = model.encoder(X, valid)
    model.decoder(Y, model.decoder.init_state(enc, valid))
    h = model.encoder.blks[0].attention.num_heads
    get = lambda att: att.attention.attention_weights.asnumpy().reshape(  # noqa: E731
        h, *att.attention.attention_weights.shape[1:])  # (heads, queries, keys), batch 1
    return ([get(b.attention) for b in model.encoder.blks],
            [get(b.attention_1) for b in model.decoder.blks],
            [get(b.attention_2) for b in model.decoder.blks])


def test_attention_json(setup):
    models, src_vocab, tgt_vocab, sentences = setup
    model = models["trained"]
    translator = _translator(model, src_vocab, tgt_vocab)
    src = ["i", "won", "!"]
    tgt = translator.translate([src])[0].tokens
    assert tgt
    att = translator.attention(src, tgt)
    n, m1 = len(src), len(tgt) + 1
    assert att["src_tokens"] == src and att["tgt_tokens"] == ["<bos>"] + tgt
    assert att["out_tokens"] == tgt + ["<eos>"]
    layers, heads = CFG.num_layers, CFG.num_heads
    for kind, rows, cols in (("encoder", n, n), ("decoder", m1, m1), ("cross", m1, n)):
        w = onp.array(att[kind])
        assert w.shape == (layers, heads, rows, cols), kind
        onp.testing.assert_allclose(w.sum(-1), 1, atol=cols * 5e-5 + 1e-6)
        assert w.min() >= 0
    assert onp.triu(onp.array(att["decoder"]), k=1).max() == 0  # causal
    # the same weights as the chapter's own imperative pass
    X, valid = translator.encode_source([src])
    Y = np.array([[tgt_vocab["<bos>"]] + tgt_vocab[tgt]])
    enc, dec, cross = _chapter_weights(model, X, valid, Y)
    for ours, theirs, rows, cols in ((att["encoder"], enc, n, n), (att["decoder"], dec, m1, m1),
                                     (att["cross"], cross, m1, n)):
        for layer, w in zip(ours, theirs):
            onp.testing.assert_allclose(onp.array(layer), w[:, :rows, :cols], atol=6e-5)


def test_attention_and_translation_leave_the_model_as_it_was(setup):
    """The graphs are hybridized alone: the model's blocks still run imperatively (the
    chapter's way, storing attention weights); a hybridized model works as well."""
    models, src_vocab, tgt_vocab, sentences = setup
    model = models["untrained"]
    translator = _translator(model, src_vocab, tgt_vocab)
    translator.translate(sentences[:3], beam_size=2)
    translator.attention(sentences[0], ["va", "!"])
    blocks = [model.encoder, model.decoder, *model.encoder.blks, *model.decoder.blks]
    assert not any(b._active for b in blocks)
    before = translator.attention(sentences[1], ["je", "."])
    model.hybridize()
    try:
        assert translator.attention(sentences[1], ["je", "."]) == before
    finally:
        model.hybridize(False)


@pytest.mark.parametrize("hybridize", [False, True])
def test_graphs_are_built_once_per_model_and_die_with_it(setup, hybridize, monkeypatch):
    """The graphs (source side, step, attention pass) are built once per model: a second
    translator of the same model builds none. Their cache never keeps its model alive: once
    the model and its translators are dropped, the model, its encoder and its decoder (which
    the graphs hold) are freed, with deferred initialisation and with the model's own blocks
    hybridized and traced before (Gluon's name scopes keep the block they were entered from).
    The cache sits beside the model, which it leaves as it was: its entry goes when the model
    is collected, the graphs (and the encoder and decoder they hold) with the next collection."""
    _, src_vocab, tgt_vocab, sentences = setup
    built, hybridized = [], step_module.hybridized
    monkeypatch.setattr(step_module, "hybridized",
                        lambda graph, *a: built.append(type(graph).__name__) or hybridized(graph, *a))
    model = d2t.build_model(CFG, len(src_vocab), len(tgt_vocab))
    model.initialize(init.Xavier(), ctx=CTX)  # deferred: the translator's first call infers
    attributes = set(vars(model))
    if hybridize:
        X = np.ones((2, 3))  # (batch, seq_len)
        model.hybridize()
        model(X, X, np.array([3, 2]), np.array([3, 1]))
    for _ in range(2):
        translator = _translator(model, src_vocab, tgt_vocab)
        best = translator.translate(sentences[:4], beam_size=2, n_best=2)
        assert [len(b) for b in best] == [2] * 4 and translator.translate(sentences[:4])
        assert len(translator.attention(sentences[0], ["va", "!"])["cross"]) == CFG.num_layers
    assert sorted(built) == ["AttentionProbe", "DecoderStep", "EncoderKV"]  # once, not twice
    refs = [weakref.ref(b) for b in (model, model.encoder, model.decoder)]
    assert set(vars(model)) == attributes  # nothing of the translator's on the user's model
    del model, translator, best
    gc.collect()
    assert refs[0]() is None  # the model
    gc.collect()
    assert [r() for r in refs] == [None] * 3


# ---------------------------------------------------------------------------- fresh graphs
def _fresh_model(src_vocab, tgt_vocab, **changes):
    d2t.set_seed(1)
    model = d2t.build_model(CFG.replace(**changes), len(src_vocab), len(tgt_vocab))
    model.initialize(init.Xavier(), ctx=CTX)
    return model


def test_prune_after_a_cached_decode_changes_the_next_one(setup):
    _, src_vocab, tgt_vocab, sentences = setup
    model = _fresh_model(src_vocab, tgt_vocab, layerdrop=0.5)  # LayerDrop's stacks can prune
    translator = _translator(model, src_vocab, tgt_vocab)
    before = translator.translate(sentences[:20])
    for stack in (model.encoder, model.decoder):
        stack.prune([0])
    after = translator.translate(sentences[:20])
    assert [h.tokens for h in after] != [h.tokens for h in before]
    for tokens, hyp in zip(sentences[:20], after):  # the pruned model's own greedy decoding
        assert hyp.tokens == reference.greedy(model, tokens, src_vocab, tgt_vocab, CFG.num_steps,
                                              CTX)


def _fast_and_imperative(model, batches, change):
    """A fast training step, then `change(model)`, then the next batch's loss from the fast
    step and from the model called imperatively (same weights; training mode)."""
    trainer = gluon.Trainer(model.collect_params(), "adam", {"learning_rate": 0.005})
    loss = d2t.MaskedSoftmaxCELoss()
    step = d2t.training.steps._fast_step(model, trainer, loss)
    (X, X_vlen, Y, Y_vlen), second = batches
    step(X, X_vlen, Y[:, :-1], Y[:, 1:], Y_vlen - 1)
    change(model)
    X, X_vlen, Y, Y_vlen = second
    with autograd.record():
        Y_hat, _ = model(X, Y[:, :-1], X_vlen, Y_vlen - 1)
        expected = float(loss(Y_hat, Y[:, 1:], Y_vlen - 1).sum())
    fast, _ = step(X, X_vlen, Y[:, :-1], Y[:, 1:], Y_vlen - 1)
    return float(fast), expected


def _batches(src_vocab, tgt_vocab):
    _, _, data_iter = d2t.load_data_nmt(CFG.batch_size, CFG.num_steps, CFG.num_examples)
    return [b for _, b in zip(range(2), data_iter)]


def test_set_drophead_after_a_fast_step_changes_the_next_one(setup):
    """Trained with DropHead 0.5, then the rate set to 0: the fast step's next loss is the
    deterministic loss of the model without DropHead (the old graph would still drop heads)."""
    _, src_vocab, tgt_vocab, _ = setup
    model = _fresh_model(src_vocab, tgt_vocab, drophead=0.5)

    def no_drophead(m):
        for blk in m.encoder.blks:
            blk.attention.set_drophead(0.0)
        for blk in m.decoder.blks:
            blk.attention_1.set_drophead(0.0)
            blk.attention_2.set_drophead(0.0)
    fast, expected = _fast_and_imperative(model, _batches(src_vocab, tgt_vocab), no_drophead)
    assert fast == pytest.approx(expected, rel=1e-5)


def test_prune_after_a_fast_step_changes_the_next_one(setup):
    _, src_vocab, tgt_vocab, _ = setup
    model = _fresh_model(src_vocab, tgt_vocab, fused_qkv=True)  # a variant's stacks, no draws
    batches = _batches(src_vocab, tgt_vocab)
    unpruned = []

    def prune(m):
        X, X_vlen, Y, Y_vlen = batches[1]
        Y_hat, _ = m(X, Y[:, :-1], X_vlen, Y_vlen - 1)
        unpruned.append(float(d2t.MaskedSoftmaxCELoss()(Y_hat, Y[:, 1:], Y_vlen - 1).sum()))
        for stack in (m.encoder, m.decoder):
            stack.prune([1])
    fast, expected = _fast_and_imperative(model, batches, prune)
    assert fast == pytest.approx(expected, rel=1e-5)
    assert abs(expected - unpruned[0]) > 1e-3 * abs(expected)  # pruning changed the loss


@pytest.mark.parametrize("beam_size", [1, 3])
def test_special_tokens_never_in_a_translation(setup, beam_size):
    """An under-trained model (the untrained one, flat outputs, with a little more weight on
    the special tokens) emits <pad>, <bos> and <unk> when nothing is masked; the translator
    never does (<unk> with no_unk), in 1,000 outputs."""
    models, src_vocab, tgt_vocab, sentences = setup
    model = models["untrained"]
    sentences = (sentences * 20)[:1000 if beam_size == 1 else 200]  # beam search is slower
    sentences = [s[:1 + i % len(s)] for i, s in enumerate(sentences)]  # prefixes: 1000 sources
    special = [tgt_vocab[t] for t in ("<pad>", "<bos>", "<unk>")]

    def emitted(**kwargs):
        hyps = _translator(model, src_vocab, tgt_vocab, **kwargs).translate(sentences, beam_size)
        return collections.Counter(t for h in hyps for t in h.tokens)
    bias = model.decoder.dense.bias
    saved = bias.data().copy()
    try:
        raised = saved.asnumpy()
        raised[special] += 1.5  # (vocab,): the output layer's bias
        bias.set_data(np.array(raised, ctx=CTX))
        free = emitted()  # the premise: unmasked, this model does emit them
        assert free["<pad>"] + free["<bos>"] > 0 and free["<unk>"] > 0, free.most_common(5)
        masked = emitted(suppress=True)
        assert masked["<pad>"] == masked["<bos>"] == 0 and masked["<unk>"] > 0
        strict = emitted(suppress=True, no_unk=True)
        assert strict["<pad>"] == strict["<bos>"] == strict["<unk>"] == 0
        assert sum(strict.values()) > len(sentences)  # still translations, not empty lines
    finally:
        bias.set_data(saved)
    with pytest.raises(ValueError, match="no_unk"):
        _translator(model, src_vocab, tgt_vocab, no_unk=True)  # suppress=False


def test_engine_masks_unk_for_subword_models_and_on_request(setup):
    """The "mxnet" engine (the CLI's, `evaluate`'s and the server's, token lists): <unk> kept
    for a word model (the chapter's default), masked with no_unk, always masked for a subword
    config."""

    def translate(cfg, no_unk=False):
        engine = MXNetEngine(model, src_vocab, tgt_vocab, cfg, WordTokenizer(), CTX, no_unk=no_unk)
        return [h.tokens for h in engine.translate(sentences)]

    models, src_vocab, tgt_vocab, sentences = setup
    assert not no_unk_for(CFG) and no_unk_for(CFG, True)
    assert no_unk_for(CFG.replace(tokenizer="subword", vocab_size=100))
    model = models["untrained"]
    bias = model.decoder.dense.bias
    saved = bias.data().copy()
    try:
        raised = saved.asnumpy()
        raised[tgt_vocab["<unk>"]] += 1.0  # (vocab,): an under-trained model fond of <unk>
        bias.set_data(np.array(raised, ctx=CTX))
        words = translate(CFG)
        assert any("<unk>" in w for w in words)
        for cfg, no_unk in ((CFG, True), (CFG.replace(tokenizer="subword", vocab_size=100), False)):
            outs = translate(cfg, no_unk)
            assert not any(t in ("<unk>", "<pad>", "<bos>") for o in outs for t in o)
    finally:
        bias.set_data(saved)
