"""The translator: greedy and beam search over one key/value-cache step graph, against
independent references (tests/decoding_reference.py: the chapter's state, gluonnlp's
BeamSearchSampler); its attention weights; graphs traced again when a block changes."""

import collections
import json

import decoding_reference as reference
import mxnet as mx
import numpy as onp
import pytest
from mxnet import autograd, gluon, init, np

import d2l_transformer as d2t
from d2l_transformer import kernels
from d2l_transformer.data import heldout_nmt
from d2l_transformer.inference import translator as translator_module
from d2l_transformer.inference.translator import Translator, length_penalty
from d2l_transformer.model import DecoderStep, EncoderKV

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


def test_greedy_update_is_the_beam_update_of_one_beam():
    """The greedy bookkeeping equals the beam update (sorting candidates against finished
    beams) with one beam, bit for bit: scores and words, with live and finished sentences."""
    rng = onp.random.RandomState(0)
    for t in (1, 2, 7):
        log_probs = onp.log(rng.dirichlet(onp.ones(50), size=6)).astype("float32")  # (6, 50)
        scores = rng.uniform(-5, 0, size=(6, 1)).astype("float32")
        alive = onp.array([[True], [False], [True], [True], [False], [True]])
        prev_lp, lp = translator_module.Translator._penalties(t, 0.6)
        ids = log_probs.argmax(axis=1)[:, None]  # what the device picks: (6, 1)
        greedy = translator_module._greedy_update(
            ids, onp.take_along_axis(log_probs, ids, axis=1), scores, alive, prev_lp, lp)
        values, top = translator_module._row_top_k(log_probs.copy(), 1)  # (6, 1) each
        beam = translator_module._beam_update(values, top, scores, alive, 1, prev_lp, lp)
        assert (beam[2] == 0).all()  # one beam: every parent is beam 0
        for x, y in zip(greedy, beam[:2]):
            assert x.dtype == y.dtype and x.shape == y.shape and (x == y).all(), (x, y)


def test_length_penalty():
    assert length_penalty(1, 0.6) == 1.0 and length_penalty(7, 0.6) == pytest.approx(2 ** 0.6)
    assert length_penalty(13, 0.0) == 1.0


@pytest.mark.parametrize("which", ["trained", "untrained"])
def test_beam_one_is_greedy_is_predict_s2s_ch8(setup, which):
    """Beam 1 == greedy (the default, pipelined) == the beam loop with one beam (tokens and
    scores) == predict_s2s_ch8 == the chapter's state decoding one sentence at a time, token
    for token on 50 sentences; the scores are the teacher-forced
    log-probabilities over the GNMT length penalty."""
    models, src_vocab, tgt_vocab, sentences = setup
    model = models[which]
    for no_unk in (False, True):  # the translator as users get it: special tokens masked
        masked = _translator(model, src_vocab, tgt_vocab, suppress=True, no_unk=no_unk)
        greedy = masked.translate(sentences)
        assert greedy == masked.translate(sentences, beam_size=1)
        with CTX, kernels.fused(CTX):
            assert masked._greedy(sentences, 0.6, True) == masked._search(sentences, 1, 0.6, True)
    translator = _translator(model, src_vocab, tgt_vocab)
    greedy = translator.translate(sentences)
    beam1 = translator.translate(sentences, beam_size=1)
    assert greedy == beam1  # tokens and scores
    with CTX, kernels.fused(CTX):  # the beam loop with one beam: the pipelined greedy's equal
        for early_stop in (True, False):
            searched = translator._search(sentences, 1, 0.6, early_stop)
            assert translator._greedy(sentences, 0.6, early_stop) == searched
    assert [h.tokens for h in greedy] == [
        h.tokens for h in translator.translate(sentences, early_stop=False)]
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


@pytest.mark.parametrize("which", ["trained", "untrained"])
def test_device_beam_search_equals_the_host_loop(setup, which):
    """Beam search with the books on the device (the fused CPU kernels, pipelined) keeps the
    host loop's hypotheses and scores bit for bit, on the same step graph's numbers: n-best
    lists, both early-stop modes, <unk> masked or not, several beam sizes."""
    if not kernels.load():
        pytest.skip("the fused kernels do not build here")
    models, src_vocab, tgt_vocab, sentences = setup
    for no_unk in (False, True):
        translator = _translator(models[which], src_vocab, tgt_vocab, suppress=True,
                                 no_unk=no_unk)
        for k, early_stop in ((2, True), (3, False), (4, True)):
            with CTX, kernels.fused(CTX):  # the same step numbers; the books on the host
                host = translator._search(sentences, k, 0.6, early_stop, k,
                                          books_on_device=False)
                device = translator._device_search(sentences, k, 0.6, early_stop, k,
                                                   compact=False)  # the whole batch throughout
            assert device == host, (which, no_unk, k, early_stop)


@pytest.mark.parametrize("which", ["trained", "untrained"])
def test_finished_sentences_leaving_the_batch_change_nothing(setup, which):
    """Greedy and beam search with the finished sentences dropped from the batch once half of
    it has finished (the default) equal the same searches on the whole batch to the end: the
    same n-best lists token for token, the scores to float rounding (a product over fewer rows
    may sum in another order), in both early-stop modes; and the batch does shrink: sentences
    of very different lengths finish at different steps."""
    models, src_vocab, tgt_vocab, sentences = setup
    translator = _translator(models[which], src_vocab, tgt_vocab, suppress=True, max_length=None)
    batch = sorted(sentences, key=len)[::3] + [["go", "."] * 6]  # lengths 1 .. 12: limits differ
    shrunk = []
    original = translator._compact

    def spy(keep, *args):
        shrunk.append(len(keep))
        return original(keep, *args)

    translator._compact = spy

    def same(compacted, whole):
        assert [[h.tokens for h in best] for best in compacted] == \
            [[h.tokens for h in best] for best in whole]
        assert onp.allclose([h.score for best in compacted for h in best],
                            [h.score for best in whole for h in best], rtol=0, atol=1e-5)

    for early_stop in (True, False):
        same(translator._greedy(batch, 0.6, early_stop),
             translator._greedy(batch, 0.6, early_stop, compact=False))
        if kernels.load():
            with CTX, kernels.fused(CTX):
                for k in (1, 2, 4):
                    same(translator._device_search(batch, k, 0.6, early_stop, k),
                         translator._device_search(batch, k, 0.6, early_stop, k, compact=False))
    assert shrunk and min(shrunk) < len(batch) // 2, shrunk


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
    hypotheses and scores, bit for bit, as the search run to every limit (early_stop=False)
    and as the search that waits for every beam to finish, in the host loop and on the device,
    at alpha 0 (CTranslate2's stop) and above; and, on the trained model, in fewer steps."""
    models, src_vocab, tgt_vocab, sentences = setup
    translator = _translator(models[which], src_vocab, tgt_vocab, suppress=True, max_length=None)
    steps, hypotheses = [], Translator._hypotheses

    def count(self, words, *args):
        steps.append(words.shape[0])
        return hypotheses(self, words, *args)

    monkeypatch.setattr(Translator, "_hypotheses", count)

    def search(k, alpha, n, early_stop, where):
        with CTX, kernels.fused(CTX):
            if where == "host":
                return translator._search(sentences, k, alpha, early_stop, n,
                                          books_on_device=False)
            return translator._device_search(sentences, k, alpha, early_stop, n, compact=False)

    fewer = []
    for where in ["host"] + (["device"] if kernels.load() else []):
        for k, alpha, n in ((2, 0.0, 1), (4, 0.0, 2), (4, 0.6, 1), (3, 1.0, 2), (4, 3.0, 1)):
            settled = search(k, alpha, n, True, where)
            settled_steps = steps[-1]
            assert settled == search(k, alpha, n, False, where), (where, k, alpha, n)
            with monkeypatch.context() as m:  # the former rule: every beam finished
                m.setattr(translator_module, "_settled",
                          lambda scores, *args: onp.zeros(len(scores), bool))
                assert settled == search(k, alpha, n, True, where), (where, k, alpha, n)
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
    exact = d2t.build_model(CFG.replace(exact_chapter=True), len(src_vocab), len(tgt_vocab))
    with pytest.raises(ValueError, match="corrected model"):
        Translator(exact, src_vocab, tgt_vocab, CTX)
    assert free.translate([]) == []


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
    from d2l_transformer.inference.text import translator_options

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


def test_translator_graphs_are_traced_for_inference_only(setup):
    """The translator's graphs (`_run`: `kernels.inference`) carry no operators asking whether
    MXNet is training (four per fused block with dropout), which were ~40 of a decoding step's
    ~100 operators (traced outside `kernels.inference`, the same graphs have them)."""
    if not kernels.load():
        pytest.skip("the fused kernels do not build here")
    _, src_vocab, tgt_vocab, sentences = setup
    model = _fresh_model(src_vocab, tgt_vocab, dropout=0.1)  # the `full` preset's dropout
    translator = _translator(model, src_vocab, tgt_vocab)
    for k in (1, 3):
        translator.translate(sentences[:4], beam_size=k)
    graphs = translator_module._GRAPHS[model]
    assert {"greedy step", "beam update step", "first beam step", "encoder"} <= {
        key[0] for key in graphs}
    for key, graph in graphs.items():
        if key[0] == "attention":
            continue
        ops = [node["op"] for node in json.loads(graph._cached_graph[1].tojson())["nodes"]]
        assert "d2t_attention_masked" in ops, key  # traced with the fused kernels
        # the flag |Dropout(ones(1)) - 1| is gone; one Dropout is left, the positional
        # encoding's own block (the identity at inference)
        assert "_npi_absolute" not in ops and ops.count("Dropout") == 1, key


@pytest.mark.parametrize("fused", [False, True])
def test_cached_step_equals_full_decoding(setup, fused):
    """Step by step through the key/value cache (each step projects only its position) == the
    graph call on the whole prefix, at every position of a teacher-forced target."""
    models, src_vocab, tgt_vocab, sentences = setup
    model = models["trained"]
    translator = _translator(model, src_vocab, tgt_vocab)
    batch = sentences[:8]
    X, valid = translator.encode_source(batch)
    T = 7
    Y = np.array(onp.random.RandomState(0).randint(3, len(tgt_vocab), size=(len(batch), T)))
    full = mx.npx.log_softmax(model.decoder(Y, model.encoder(X, valid), valid)).asnumpy()
    encode, step = EncoderKV(model), DecoderStep(model.decoder)
    for graph in (encode, step):
        translator_module._hybridize_alone(graph)
    with kernels.fused(CTX) if fused else mx.cpu():
        kv = translator_module._run(encode, X, valid)
        empty = np.zeros((len(batch), T, kv[0].shape[-1]))
        caches = []
        for i in range(0, len(kv), 2):
            caches += [empty, empty, kv[i], kv[i + 1]]
        for t in range(T):
            log_probs, *self_kv = translator_module._run(step, Y[:, t:t + 1], np.array([t]),
                                                         valid, *caches)
            caches[0::4], caches[1::4] = self_kv[0::2], self_kv[1::2]
            onp.testing.assert_allclose(log_probs.asnumpy(), full[:, t], rtol=1e-5, atol=1e-5)
    if fused and kernels.load():
        assert "d2t_attention" in step._cached_graph[1].tojson()


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


# ---------------------------------------------------------------------------- fresh graphs
def _fresh_model(src_vocab, tgt_vocab, **changes):
    d2t.set_seed(1)
    model = d2t.build_model(CFG.replace(**changes), len(src_vocab), len(tgt_vocab))
    model.initialize(init.Xavier(), ctx=CTX)
    return model


def test_prune_after_a_cached_decode_changes_the_next_one(setup):
    _, src_vocab, tgt_vocab, sentences = setup
    model = _fresh_model(src_vocab, tgt_vocab)
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
    model = _fresh_model(src_vocab, tgt_vocab)
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


def test_switching_kernels_off_traces_the_step_again(setup, monkeypatch):
    models, src_vocab, tgt_vocab, sentences = setup
    model = _fresh_model(src_vocab, tgt_vocab)
    translator = _translator(model, src_vocab, tgt_vocab)
    with_kernels = translator.translate(sentences[:10])
    step = translator_module._GRAPHS[model][("greedy step", "cpu")]
    if kernels.load():
        assert "d2t_" in step._cached_graph[1].tojson()
    monkeypatch.setenv("D2L_TRANSFORMER_KERNELS", "0")
    without = translator.translate(sentences[:10])
    assert "d2t_" not in step._cached_graph[1].tojson()
    assert [h.tokens for h in without] == [h.tokens for h in with_kernels]


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


def test_translate_tokens_masks_unk_for_subword_models_and_on_request(setup):
    """`translate_tokens` (the CLI's and `evaluate`'s): <unk> kept for a word model (the
    chapter's default), masked with no_unk, always masked for a subword config."""
    from d2l_transformer.inference.text import no_unk_for, translate_tokens

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
        words = translate_tokens(model, sentences, src_vocab, tgt_vocab, CFG, CTX)
        assert any("<unk>" in w.split() for w in words)
        for cfg, no_unk in ((CFG, True), (CFG.replace(tokenizer="subword", vocab_size=100), False)):
            outs = translate_tokens(model, sentences, src_vocab, tgt_vocab, cfg, CTX, no_unk=no_unk)
            assert not any(t in ("<unk>", "<pad>", "<bos>") for o in outs for t in o.split())
    finally:
        bias.set_data(saved)
