"""``tie_embeddings`` (Press & Wolf 2017, "Using the Output Embedding to Improve Language
Models"): the decoder's embedding is its output layer's weight ("target", fairseq's
``--share-decoder-input-output-embed``), and the encoder's embedding too over one joint subword
vocabulary ("all", three-way tying). Tied once in `build.tie_embeddings` (docs/variants.md)."""

import math
import os
import subprocess
import sys
from pathlib import Path

import decoding_reference as reference
import mxnet as mx
import numpy as onp
import pytest
from conftest import assert_close
from isolation import BLOCKER  # tests/isolation.py
from mxnet import autograd, init, np, npx
from mxnet import name as mx_name
from mxnet.gluon import nn

import d2l_transformer as d2t
from d2l_transformer import checkpoint, cli, kernels
from d2l_transformer.data import heldout_nmt, load_data_split, split_corpus
from d2l_transformer.data.tokenize import SubwordTokenizer
from d2l_transformer.inference.export import export
from d2l_transformer.training import steps
from d2l_transformer.training.optim import make_trainer

CTX = mx.cpu()
CFG = d2t.TINY.replace(num_layers=2, num_heads=2, embedding_size=16, ffn_hidden_size=32)
TARGET, ALL = CFG.replace(tie_embeddings="target"), CFG.replace(tie_embeddings="all")


@pytest.fixture(scope="module")
def data():
    """The TINY preset's slice of the chapter's data (200 pairs, batch 16)."""
    return d2t.load_data_nmt(CFG.batch_size, CFG.num_steps, CFG.num_examples)


@pytest.fixture(scope="module")
def joint():
    """One sentencepiece model of both languages (2,000 pairs' training part, 500 pieces)."""
    train, _, _ = split_corpus(2000, 100, 100)
    return SubwordTokenizer.train(train.source, train.target, 500, joint=True), train


def _built(cfg, src_size, tgt_size, batch, seed=0):
    """`build_model`, Xavier from `seed`, its deferred shapes set by one call on `batch`."""
    d2t.set_seed(seed)
    model = d2t.build_model(cfg, src_size, tgt_size)
    model.initialize(init.Xavier(), ctx=CTX)
    X, X_vlen, Y, _ = batch
    model(X, Y[:, :-1], X_vlen)
    return model


def _distinct(model):
    """The model's trainable Parameters, each once (by object), and their number of weights."""
    params = list({id(p): p for p in model.collect_params().values()
                   if p.grad_req != "null"}.values())
    return params, sum(int(onp.prod(p.shape)) for p in params)


def _uses(model):
    """The matrices tying joins: the encoder's and decoder's embeddings, the output layer."""
    return [model.encoder.embed.weight, model.decoder.embed.weight, model.decoder.dense.weight]


# ------------------------------------------------------------------ "none" is today's model
def test_none_is_todays_model_bit_for_bit(data):
    """Default and explicit "none" build the chapter's classes, untied, with today's parameter
    names, and give the outputs of the chapter's blocks built by hand from the same seed."""
    src_vocab, tgt_vocab, it = data
    batch = next(iter(it))
    X, X_vlen, Y, _ = batch
    args = (CFG.embedding_size, CFG.ffn_hidden_size, CFG.num_heads, CFG.num_layers, CFG.dropout)
    d2t.set_seed(0)
    with mx_name.NameManager():
        by_hand = d2t.EncoderDecoder(d2t.TransformerEncoder(len(src_vocab), *args),
                                     d2t.TransformerDecoder(len(tgt_vocab), *args))
    by_hand.initialize(init.Xavier(), ctx=CTX)
    expected = by_hand(X, Y[:, :-1], X_vlen)[0].asnumpy()
    for cfg in (CFG, CFG.replace(tie_embeddings="none")):
        model = _built(cfg, len(src_vocab), len(tgt_vocab), batch)
        assert type(model.decoder) is d2t.TransformerDecoder
        assert model.decoder.dense.weight is not model.decoder.embed.weight
        assert list(model.collect_params().keys()) == list(by_hand.collect_params().keys())
        assert (model(X, Y[:, :-1], X_vlen)[0].asnumpy() == expected).all()


# ------------------------------------------------------------------ "target"
def test_target_shares_one_parameter_and_counts_it_once(data):
    src_vocab, tgt_vocab, it = data
    batch = next(iter(it))
    V, d = len(tgt_vocab), CFG.embedding_size
    untied = _built(CFG, len(src_vocab), V, batch)
    tied = _built(TARGET, len(src_vocab), V, batch)
    enc, emb, out = _uses(tied)
    assert out is emb and enc is not emb and emb.shape == (V, d)
    assert type(tied.decoder.dense) is nn.Dense and type(tied.decoder.embed) is nn.Embedding
    assert type(tied.decoder) is d2t.TransformerDecoder  # the blocks keep their classes
    assert tied.decoder.dense.bias is not None and tied.decoder.dense.bias.shape == (V,)
    (p_untied, n_untied), (p_tied, n_tied) = _distinct(untied), _distinct(tied)
    assert n_untied - n_tied == V * d == 35 * 16 and len(p_untied) - len(p_tied) == 1
    listed = list(tied.collect_params().values())  # trainable ones and the constants P
    assert len(listed) == len({id(p) for p in listed}) and sum(p is emb for p in listed) == 1
    trainer = make_trainer(tied, 0.005)
    assert len(trainer._params) == len(listed)
    assert sum(p is emb for p in trainer._params) == 1
    assert tied(batch[0], batch[2][:, :-1], batch[1])[0].shape == (16, CFG.num_steps - 1, V)


def _loss_and_grads(model, batch, graph):
    """The summed masked CE of `batch` and every trainable gradient, ``{structural name:
    array}``: imperative, or through the fast path's hybridized `TrainGraph` with the kernels."""
    X, X_vlen, Y, Y_vlen = batch
    Y_input, Y_label, Y_vlen = Y[:, :-1], Y[:, 1:], Y_vlen - 1
    loss = d2t.MaskedSoftmaxCELoss()
    if graph:
        g = steps._graph(model, loss)
        with autograd.record(), kernels.fused(CTX):
            l = g(X, X_vlen, Y_input, Y_label, Y_vlen)  # (batch,)
    else:
        with autograd.record():
            l = loss(model(X, Y_input, X_vlen)[0], Y_label, Y_vlen)  # (batch,)
    l.backward()
    return float(l.sum()), {k: p.grad().asnumpy().copy()
                            for k, p in model._collect_params_with_prefix().items()
                            if p.grad_req != "null"}


@pytest.mark.parametrize("how", ["target", "all"])
@pytest.mark.parametrize("graph", [False, True], ids=["imperative", "graph"])
def test_shared_gradient_is_the_sum_of_the_untied_uses(how, graph, data):
    """An untied model whose tied matrices are copied equal gives the same loss; the tied
    matrix's gradient is the SUM of theirs (2 uses for "target", 3 for "all"), every other
    gradient the same. "all" here: one size for both vocabularies (the chapter's ids)."""
    src_vocab, tgt_vocab, it = data
    batch = next(iter(it))
    sizes = (len(src_vocab), len(tgt_vocab)) if how == "target" else (len(tgt_vocab),) * 2
    untied = _built(CFG, *sizes, batch)
    tied = _built(CFG.replace(tie_embeddings=how), *sizes, batch, seed=1)
    uses = ["decoder.embed.weight", "decoder.dense.weight"] + (
        ["encoder.embed.weight"] if how == "all" else [])
    for name in uses[1:]:
        untied._collect_params_with_prefix()[name].set_data(_uses(untied)[1].data())
    tied_params = tied._collect_params_with_prefix()
    for name, p in untied._collect_params_with_prefix().items():
        tied_params[name].set_data(p.data())  # the shared one: the same matrix, several times
    loss_u, grads_u = _loss_and_grads(untied, batch, graph)
    loss_t, grads_t = _loss_and_grads(tied, batch, graph)
    assert loss_t == pytest.approx(loss_u, rel=1e-6) and loss_u > 10
    summed = sum(grads_u[name] for name in uses)
    assert all(abs(grads_u[name]).max() > 1e-3 for name in uses)  # every use contributes
    for name in uses:
        onp.testing.assert_allclose(grads_t[name], summed, rtol=1e-4, atol=1e-6)
        assert abs(grads_t[name] - grads_u[name]).max() > 1e-3  # not one use alone
    for name in set(grads_u) - set(uses):
        onp.testing.assert_allclose(grads_t[name], grads_u[name], rtol=1e-4, atol=1e-6)


def test_one_step_fast_equals_imperative(data):
    """One training step from the same weights on the fast path (`TrainGraph`, ClipAdam) and
    on the imperative one (the chapter's clipping, ``trainer.step``): the same updated matrix,
    which moved, still one Parameter."""
    src_vocab, tgt_vocab, it = data
    batch = next(iter(it))
    models = [_built(TARGET, len(src_vocab), len(tgt_vocab), batch) for _ in range(2)]
    first = models[0]._collect_params_with_prefix()
    for name, p in models[1]._collect_params_with_prefix().items():
        p.set_data(first[name].data())
    before = models[0].decoder.embed.weight.data().asnumpy().copy()
    X, X_vlen, Y, Y_vlen = batch
    losses = []
    for model, make in zip(models, (steps._imperative_step, steps._fast_step)):
        step = make(model, make_trainer(model, 0.005), d2t.MaskedSoftmaxCELoss())
        losses.append(float(step(X, X_vlen, Y[:, :-1], Y[:, 1:], Y_vlen - 1)[0]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    slow, fast = (m.decoder.embed.weight.data().asnumpy() for m in models)
    assert abs(slow - before).max() == pytest.approx(0.005, rel=1e-3)  # Adam's first step: lr
    onp.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-6)
    for model in models:
        assert model.decoder.dense.weight is model.decoder.embed.weight


def test_trains_on_both_paths_to_the_same_losses(data):
    """Two epochs from seed 0 with the chapter's loop, imperatively and on the fast graph."""
    src_vocab, tgt_vocab, it = data
    curves = []
    for fast in (False, True):
        d2t.set_seed(0)
        model = d2t.build_model(TARGET, len(src_vocab), len(tgt_vocab))
        curves.append([])
        d2t.train_s2s_ch8(model, it, CFG.lr, 2, CTX, fast=fast,
                          on_epoch=lambda e, loss: curves[-1].append(loss))
        assert model.decoder.dense.weight is model.decoder.embed.weight
    assert math.isfinite(curves[1][0]) and 0 < curves[1][1] < curves[1][0]
    assert curves[0] == pytest.approx(curves[1], rel=1e-4)


# ------------------------------------------------------------------ "all"
def test_joint_vocabulary_and_three_way_tie(joint, data):
    tok, train = joint
    assert tok.src_vocab().idx_to_token == tok.tgt_vocab().idx_to_token
    assert len(tok.src_vocab()) == 500
    files = tok.files()
    assert files["spm_src.model"] == files["spm_tgt.model"]
    src, tgt = tok.encode("I'm home."), tok.encode_target("Je suis chez moi.")
    assert all(t in tok.src_vocab().token_to_idx for t in src + tgt)
    separate = SubwordTokenizer.train(train.source, train.target, 500)
    assert separate.src_vocab().idx_to_token != separate.tgt_vocab().idx_to_token
    split = load_data_split(16, 10, 2000, 0, 100, 100, tokenizer="subword", vocab_size=500,
                            joint_vocab=True)
    assert split.src_vocab.idx_to_token == split.tgt_vocab.idx_to_token == tok.src_vocab().idx_to_token
    V, d = len(tok.src_vocab()), CFG.embedding_size
    batch = next(iter(data[2]))
    untied, tied = (_built(c, V, V, batch) for c in (CFG, ALL))
    enc, emb, out = _uses(tied)
    assert enc is emb is out and enc.shape == (V, d)
    (p_untied, n_untied), (p_tied, n_tied) = _distinct(untied), _distinct(tied)
    assert n_untied - n_tied == 2 * V * d and len(p_untied) - len(p_tied) == 2
    assert sum(p is enc for p in make_trainer(tied, 0.005)._params) == 1


# ------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize("how", ["target", "all"])
def test_checkpoint_round_trip_keeps_the_tie(how, data, joint, tmp_path):
    src_vocab, tgt_vocab, it = data
    if how == "all":  # one vocabulary for both sides
        src_vocab = tgt_vocab = joint[0].src_vocab()
    batch = next(iter(it))
    model = _built(CFG.replace(tie_embeddings=how), len(src_vocab), len(tgt_vocab), batch)
    path = checkpoint.save(str(tmp_path / "m"), model, src_vocab, tgt_vocab,
                           CFG.replace(tie_embeddings=how))
    saved = mx.nd.load(os.path.join(path, checkpoint.PARAMS))
    shared = model.decoder.embed.weight.data().asnumpy()
    names = ["decoder.embed.weight", "decoder.dense.weight"] + (
        ["encoder.embed.weight"] if how == "all" else [])
    for name in names:  # save_parameters' structural names: the one matrix under each
        assert (saved[name].asnumpy() == shared).all()
    loaded, *_ = checkpoint.load(path)
    enc, emb, out = _uses(loaded)
    assert out is emb and (enc is emb) == (how == "all")
    X, X_vlen, Y, _ = batch
    assert_close(loaded(X, Y[:, :-1], X_vlen)[0], model(X, Y[:, :-1], X_vlen)[0], tol=0)
    new = np.array(onp.random.RandomState(0).normal(size=emb.shape).astype("float32"))
    emb.set_data(new)  # one matrix: the embedding and the output layer change together
    H = np.array(onp.random.RandomState(1).normal(size=(2, 3, CFG.embedding_size)).astype("float32"))
    ids = np.array([[4, 5, 6]])
    looked_up = new[ids[0]].reshape(1, 3, -1)  # (3, d) rows -> (1, 3, d), embed's shape
    assert_close(loaded.decoder.embed(ids), looked_up, tol=0)
    expected = np.dot(H, new.T) + loaded.decoder.dense.bias.data()  # (2, 3, V)
    assert_close(loaded.decoder.dense(H), expected, tol=1e-5)
    if how == "all":
        assert_close(loaded.encoder.embed(ids), looked_up, tol=0)


def test_cli_resume_of_a_tied_model_repeats_the_whole_run(tmp_path, capsys):
    """TINY with "target": 2 epochs straight == 1 epoch, then --resume to 2 (bit for bit); the
    resumed model is still tied."""
    train = ["train", "--preset", "tiny", "--ctx", "cpu", "--quiet", "--seed", "3",
             "--set", "tie_embeddings=target"]
    whole, part = str(tmp_path / "whole"), str(tmp_path / "part")
    assert cli.main(train + ["--epochs", "2", "--out", whole]) == 0
    assert cli.main(train + ["--epochs", "1", "--out", part]) == 0
    assert cli.main(train + ["--epochs", "2", "--out", part, "--resume"]) == 0
    assert "from epoch 2" in capsys.readouterr().err
    a, b = (mx.nd.load(os.path.join(d, checkpoint.PARAMS)) for d in (whole, part))
    assert sorted(a) == sorted(b) and all((a[k] == b[k]).asnumpy().all() for k in a)
    assert (a["decoder.embed.weight"] == a["decoder.dense.weight"]).asnumpy().all()
    model = checkpoint.load(part)[0]
    assert model.decoder.dense.weight is model.decoder.embed.weight


# ------------------------------------------------------------------ translation and export
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The chapter preset with "target", 20 epochs on the fast path, saved; 200 held-out
    sources."""
    cfg = d2t.CHAPTER.replace(tie_embeddings="target")
    d2t.set_seed(0)
    src_vocab, tgt_vocab, it = d2t.load_data_nmt(cfg.batch_size, cfg.num_steps, cfg.num_examples)
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    d2t.train_s2s_ch8(model, it, cfg.lr, 20, CTX, fast=True)
    model.hybridize(False)
    root = tmp_path_factory.mktemp("tied")
    model_dir = checkpoint.save(str(root / "model"), model, src_vocab, tgt_vocab, cfg,
                                {"preset": "chapter"})
    sentences = heldout_nmt(src_vocab, tgt_vocab, cfg.num_examples, 200)["unfiltered"][0]
    return dict(model=model, src_vocab=src_vocab, tgt_vocab=tgt_vocab, cfg=cfg,
                model_dir=model_dir, root=root, sentences=sentences)


@pytest.mark.slow
def test_translator_cached_equals_full_decoding(trained):
    """Greedy translations through the key/value cache == argmax decoding of the whole
    prefix and of the chapter's state, step by step."""
    t = trained
    translator = d2t.Translator(t["model"], t["src_vocab"], t["tgt_vocab"], CTX,
                                num_steps=t["cfg"].num_steps)
    sentences = [s.split() for s in ("go .", "i lost .", "he's calm .", "i'm home .")]
    sentences += t["sentences"][:16]
    hyps = [h.tokens for h in translator.translate(sentences)]
    assert len({tuple(h) for h in hyps}) > 5
    for tokens, hyp in zip(sentences, hyps):
        for mode in ("prefix", "state"):
            assert hyp == reference.greedy(t["model"], tokens, t["src_vocab"], t["tgt_vocab"],
                                           t["cfg"].num_steps, CTX, mode=mode)


def _ct2_greedy(out, sentences, cfg):
    """CTranslate2's greedy hypotheses with the export's options (`ct2_translate`, imported
    here: that module skips itself where ctranslate2 is missing)."""
    from test_ctranslate2 import ct2_translate
    return ct2_translate(out, sentences, cfg)


@pytest.mark.slow
def test_ctranslate2_export_translates_greedy_equal(trained):
    pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed "
                                              "(pip install '.[ctranslate2]')")
    t = trained
    out = t["root"] / "ct2"
    export(t["model_dir"], str(out), format="ctranslate2")
    translator = d2t.Translator(t["model"], t["src_vocab"], t["tgt_vocab"], CTX,
                                num_steps=t["cfg"].num_steps)
    ours = [h.tokens for h in translator.translate(t["sentences"])]
    theirs = _ct2_greedy(out, t["sentences"], t["cfg"])
    assert len(ours) == 200 and len({tuple(o) for o in ours}) > 20
    assert sum(a == b for a, b in zip(ours, theirs)) == 200


@pytest.mark.parametrize("how", ["target", "all"])
def test_ctranslate2_scores_equal_ours(how, data, joint, tmp_path):
    """Random weights: CTranslate2's per-token log-probabilities of given translations equal
    ours to 1e-4 (tests/test_ctranslate2.py's check); the tied matrix is stored once (the
    spec aliases equal variables): model.bin is one float32 (V, d) smaller than untied."""
    ct2 = pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed "
                                                    "(pip install '.[ctranslate2]')")
    src_vocab, tgt_vocab, it = data
    pairs = [("go .", "va !"), ("i won !", "j'ai gagné !"), ("he's calm .", "il est calme .")]
    if how == "all":
        tok = joint[0]
        src_vocab = tgt_vocab = tok.src_vocab()
        pairs = [(" ".join(tok.encode(s)), " ".join(tok.encode_target(t)))
                 for s, t in (("Go.", "Va !"), ("I won!", "J'ai gagné !"), ("He's calm.", "Il est calme."))]
    cfg = CFG.replace(tie_embeddings=how)
    d2t.set_seed(0)
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    model.initialize(mx.init.Xavier(magnitude=3))
    X = np.ones((1, 2))
    model(X, X, np.array([2]))
    model_dir = checkpoint.save(str(tmp_path / "model"), model, src_vocab, tgt_vocab, cfg)
    export(model_dir, str(tmp_path / "ct2"), format="ctranslate2")
    if how == "target":  # the same model untied: model.bin holds the matrix once more
        untied = d2t.build_model(CFG, len(src_vocab), len(tgt_vocab))
        untied.initialize(mx.init.Xavier(magnitude=3))
        untied(X, X, np.array([2]))
        untied_dir = checkpoint.save(str(tmp_path / "untied"), untied, src_vocab, tgt_vocab, CFG)
        export(untied_dir, str(tmp_path / "ct2_untied"), format="ctranslate2")
        untied_size = os.path.getsize(tmp_path / "ct2_untied" / "model.bin")
        V, d = len(tgt_vocab), CFG.embedding_size
        saved = untied_size - os.path.getsize(tmp_path / "ct2" / "model.bin")
        assert 4 * V * d - 64 <= saved <= 4 * V * d  # float32 (V, d), less an alias's name
    translator = ct2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=2)
    sources, targets = [s.split() for s, _ in pairs], [t.split() for _, t in pairs]
    for s, t, r in zip(sources, targets, translator.score_batch(sources, targets)):
        Xs, valid = np.array([src_vocab[s]]), np.array([len(s)])  # (1, n), (1,)
        Ys = np.array([[tgt_vocab["<bos>"]] + tgt_vocab[t]])  # (1, m + 1)
        logits, _ = model.decoder(Ys, model.decoder.init_state(model.encoder(Xs, valid), valid))
        ids = tgt_vocab[t] + [tgt_vocab["<eos>"]]
        ours = npx.log_softmax(logits)[0].asnumpy()[onp.arange(len(ids)), ids]  # (m + 1,)
        onp.testing.assert_allclose(r.log_probs, ours, rtol=0, atol=1e-4)
        assert ours.min() < -2


@pytest.mark.slow
def test_mxnet_export_translates_as_the_package(trained):
    """The MXNet deployment export of a tied model holds the matrix once per graph and its
    reference decoder (scripts/exported_translate.py, without the package) translates as the
    `Translator` does."""
    t = trained
    out = t["root"] / "mxnet"
    export(t["model_dir"], str(out))
    step = mx.nd.load(str(out / "decoder_step-0000.params"))
    V, d = len(t["tgt_vocab"]), t["cfg"].embedding_size
    assert sum(a.shape == (V, d) for a in step.values()) == 1
    script = Path(__file__).resolve().parents[1] / "scripts" / "exported_translate.py"
    sentences = t["sentences"][:30]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    code = (f"sys.argv = [{str(script)!r}, {str(out)!r}]\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-I", "-c", BLOCKER + code], cwd=str(out.parent),
                            input="\n".join(" ".join(s) for s in sentences), env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    translator = d2t.Translator(t["model"], t["src_vocab"], t["tgt_vocab"], CTX,
                                num_steps=t["cfg"].num_steps)
    assert result.stdout.splitlines() == [" ".join(h.tokens)
                                          for h in translator.translate(sentences)]


# ------------------------------------------------------------------ "all" end to end
ALL_RUN = ["train", "--preset", "full", "--set", "num_examples=2000", "--set", "num_valid=100",
           "--set", "num_test=100", "--set", "vocab_size=500", "--set", "embedding_size=32",
           "--set", "ffn_hidden_size=64", "--set", "warmup_steps=10", "--set",
           "valid_sentences=50", "--set", "tie_embeddings=all", "--ctx", "cpu", "--quiet"]


@pytest.mark.slow
def test_all_trains_loads_translates_and_resumes(tmp_path, capsys):
    out = str(tmp_path / "all")
    assert cli.main(ALL_RUN + ["--epochs", "1", "--out", out]) == 0
    model, src_vocab, tgt_vocab, cfg, summary = checkpoint.load(out)
    assert cfg.tie_embeddings == "all" and src_vocab.idx_to_token == tgt_vocab.idx_to_token
    enc, emb, dense = _uses(model)
    assert enc is emb is dense and emb.shape == (len(src_vocab), 32)
    spm = [open(os.path.join(out, n), "rb").read() for n in ("spm_src.model", "spm_tgt.model")]
    assert spm[0] == spm[1]
    loaded = checkpoint.load_tokenizer(out)
    assert loaded.src_vocab().idx_to_token == loaded.tgt_vocab().idx_to_token
    capsys.readouterr()
    assert cli.main(["translate", "--engine", "mxnet",
                     "--model", out, "--ctx", "cpu", "I am home.", "Go."]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2  # one line each (1 epoch: not good)
    assert cli.main(ALL_RUN + ["--epochs", "2", "--out", out, "--resume"]) == 0
    assert "from epoch 2" in capsys.readouterr().err
    resumed, *_, cfg, _ = checkpoint.load(out)
    assert resumed.encoder.embed.weight is resumed.decoder.dense.weight
    assert not (resumed.encoder.embed.weight.data() == emb.data()).asnumpy().all()  # it trained
    pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
    export(out, str(tmp_path / "ct2"), format="ctranslate2")
    _, _, test = split_corpus(cfg.num_examples, cfg.num_valid, cfg.num_test, by=cfg.split_by)
    tok = checkpoint.load_tokenizer(out)
    sentences = [tok.encode(t) for t in test.source]
    translator = d2t.Translator(resumed, src_vocab, tgt_vocab, CTX, num_steps=cfg.num_steps)
    ours = [h.tokens for h in translator.translate(sentences)]
    # 2 epochs of 8 batches translate little; the export's exactness with random weights:
    # test_ctranslate2_scores_equal_ours[all]
    assert len(ours) == 100 and ours == _ct2_greedy(tmp_path / "ct2", sentences, cfg)


# ------------------------------------------------------------------ refusals
def test_bad_combinations_are_one_line_errors(data, capsys, tmp_path):
    src_vocab, tgt_vocab, _ = data
    for changes, words in [({"tie_embeddings": "both"},
                            "tie_embeddings must be one of none, target, all"),
                           ({"tie_embeddings": "all"}, "tie_embeddings all needs one joint "
                                                       "vocabulary: tokenizer subword")]:
        with pytest.raises(ValueError) as e:
            d2t.CHAPTER.with_overrides(changes)
        assert words in str(e.value) and "\n" not in str(e.value)
    for cfg, words in [(TARGET.replace(exact_chapter=True), "not exact_chapter"),
                       (TARGET.replace(architecture="seq2seq"), "not the seq2seq model"),
                       (TARGET.replace(architecture="attention"), "not the attention model"),
                       (ALL.replace(tokenizer="subword", vocab_size=50),
                        "one joint vocabulary, not 43 source and 35 target tokens")]:
        with pytest.raises(ValueError) as e:
            d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
        assert words in str(e.value) and "\n" not in str(e.value) and "tie_embeddings" in str(e.value)
    sub = ALL.replace(tokenizer="subword", vocab_size=50)
    model = d2t.build_model(sub, len(tgt_vocab), len(tgt_vocab))
    model.initialize()
    model(np.ones((1, 2)), np.ones((1, 2)), np.array([2]))
    with pytest.raises(checkpoint.CheckpointError, match="vocabularies differ"):
        checkpoint.save(str(tmp_path / "m"), model, d2t.Vocab.from_dict(
            {"idx_to_token": tgt_vocab.idx_to_token[:-1] + ["zz"]}), tgt_vocab, sub)
    assert not os.path.exists(tmp_path / "m")
    capsys.readouterr()
    assert cli.main(["train", "--preset", "tiny", "--ctx", "cpu", "--quiet", "--epochs", "1",
                     "--out", str(tmp_path / "x"), "--set", "tie_embeddings=all"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "tokenizer subword" in err[0]
    assert not os.path.exists(tmp_path / "x")
