"""The literature's variants: subclasses of the chapter's blocks (d2l_transformer.variants)."""

import mxnet as mx
import numpy as onp
import pytest
from conftest import ModelGraph, assert_close, copy_params
from mxnet import autograd, np

import d2l_transformer as d2t
from d2l_transformer.contrib.averaging import average_checkpoints
from d2l_transformer.contrib.classify import (
    TransformerClassifier,
    accuracy,
    load_data_lang_id,
    train_classifier,
)
from d2l_transformer.variants import (
    ScaleNorm,
    VariantAddNorm,
    VariantMultiHeadAttention,
    VariantTransformerDecoder,
    VariantTransformerEncoder,
    drophead_schedule,
    every_other_layers,
    fuse_qkv_params,
)

V_SRC, V_TGT, D, FFN, HEADS, LAYERS = 30, 20, 16, 32, 4, 2
OFF = {"pre_norm": False, "norm": "layer", "fixnorm": False, "layerdrop": 0.0,
       "drophead": 0.0, "fused_qkv": False, "pos_encoding": "sincos"}
CFG = d2t.TINY.replace(embedding_size=D, ffn_hidden_size=FFN, num_heads=HEADS,
                       num_layers=LAYERS, dropout=0.0)


def _batch():
    X = np.array(onp.random.RandomState(1).randint(0, V_SRC, size=(3, 6)))
    Y = np.array(onp.random.RandomState(2).randint(0, V_TGT, size=(3, 5)))
    return X, Y, np.array([6, 2, 4]), np.array([5, 3, 1])


def _run(model):
    X, Y, xl, yl = _batch()
    model.initialize()
    return model(X, Y, xl, yl)


def test_all_off_is_the_chapter_and_the_variant_classes_equal_it():
    """Explicit off values build the chapter's classes; the variant classes with every option
    off compute the same, imperatively and hybridized, with the same parameter names."""
    default, off = d2t.build_model(CFG, V_SRC, V_TGT), d2t.build_model(CFG.replace(**OFF), V_SRC, V_TGT)
    assert type(off.encoder) is d2t.TransformerEncoder and type(off.decoder) is d2t.TransformerDecoder
    args = (D, FFN, HEADS, LAYERS, 0.0)
    variant = d2t.EncoderDecoder(VariantTransformerEncoder(V_SRC, *args),
                                 VariantTransformerDecoder(V_TGT, *args))
    _run(default), _run(variant)
    copy_params(default, variant)
    assert list(default._collect_params_with_prefix()) == list(variant._collect_params_with_prefix())
    X, Y, xl, yl = _batch()
    assert_close(default(X, Y, xl)[0], variant(X, Y, xl)[0], tol=0)
    graph = ModelGraph(variant)
    graph.hybridize()
    assert_close(graph(X, Y, xl), default(X, Y, xl)[0], tol=1e-6)


def test_scalenorm_hand_computed():
    norm = ScaleNorm(hidden_size=2)
    norm.initialize()
    out = norm(np.array([[[3.0, 4.0], [0.0, 0.0]]]))
    # g = sqrt(2); [3, 4] / 5 * sqrt(2); the zero row stays 0 thanks to eps
    assert_close(out, [[[0.6 * 2 ** 0.5, 0.8 * 2 ** 0.5], [0.0, 0.0]]])


def test_prenorm_addnorm_hand_computed():
    addnorm = VariantAddNorm(0.0, pre_norm=True)
    addnorm.initialize()
    X, Y = np.array([[[1.0, 3.0]]]), np.array([[[2.0, 2.0]]])
    assert_close(addnorm(X, Y), [[[3.0, 5.0]]])  # X + Y, no norm after the sum
    assert_close(addnorm.prenorm(X), [[[-1.0, 1.0]]], tol=1e-3)  # LayerNorm of the input


@pytest.mark.parametrize("kw", [{"pre_norm": True}, {"norm": "scale", "fixnorm": True},
                                {"pre_norm": True, "norm": "scale"}])
def test_norm_variants_shapes_and_final_norm(kw):
    enc = VariantTransformerEncoder(V_SRC, D, FFN, HEADS, LAYERS, 0.0, **kw)
    dec = VariantTransformerDecoder(V_TGT, D, FFN, HEADS, LAYERS, 0.0, **kw)
    enc.initialize(), dec.initialize()
    X, Y, xl, _ = _batch()
    H = enc(X, xl)
    assert H.shape == (3, 6, D) and dec(Y, dec.init_state(H, xl))[0].shape == (3, 5, V_TGT)
    if kw.get("pre_norm") and kw.get("norm", "layer") == "layer":
        # the final LayerNorm: every position has mean 0 and variance 1
        assert_close(H.mean(axis=-1), onp.zeros((3, 6)), tol=1e-5)
        assert_close(H.var(axis=-1), onp.ones((3, 6)), tol=1e-3)
    if kw.get("norm") == "scale" and kw.get("pre_norm"):
        # the final ScaleNorm: every position has norm g = sqrt(D)
        assert_close(np.sqrt((H * H).sum(axis=-1)), onp.full((3, 6), D ** 0.5), tol=1e-4)


def test_fixnorm_unit_embeddings():
    enc = VariantTransformerEncoder(V_SRC, D, FFN, HEADS, LAYERS, 0.0, fixnorm=True)
    enc.initialize()
    E = enc.embed(_batch()[0])  # unit rows (the stack then multiplies by sqrt(d))
    assert_close(np.sqrt((E * E).sum(axis=-1)), onp.ones((3, 6)), tol=1e-5)


def _skipped_fraction(hybridize, p=0.3, n=300):
    enc = VariantTransformerEncoder(V_SRC, D, FFN, HEADS, 1, 0.0, layerdrop=p)
    enc.initialize()
    if hybridize:
        enc.hybridize()
    X, _, xl, _ = _batch()
    embedded = enc.pos_encoding(enc.embed(X) * D ** 0.5)
    skipped = 0
    with autograd.train_mode():
        for _ in range(n):
            skipped += bool((enc(X, xl) == embedded).all())
    return skipped / n, enc, embedded


@pytest.mark.parametrize("hybridize", [False, True])
def test_layerdrop_rate_in_training_none_at_inference(hybridize):
    rate, enc, embedded = _skipped_fraction(hybridize)
    assert 0.22 < rate < 0.38  # p = 0.3, 300 draws: sd 0.026
    X, _, xl, _ = _batch()
    for _ in range(20):  # predict mode: the block always runs
        assert not bool((enc(X, xl) == embedded).all())


def test_layerdrop_inference_pruning_every_other():
    assert every_other_layers(6, 3) == [0, 2, 4]
    assert every_other_layers(4, 4) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        every_other_layers(4, 0)
    full = d2t.TransformerEncoder(V_SRC, D, FFN, HEADS, 2, 0.0)
    pruned = VariantTransformerEncoder(V_SRC, D, FFN, HEADS, 2, 0.0, layerdrop=0.5)
    one = d2t.TransformerEncoder(V_SRC, D, FFN, HEADS, 1, 0.0)
    X, _, xl, _ = _batch()
    for m in (full, pruned, one):
        m.initialize()
        m(X, xl)
    copy_params(full, pruned)
    pruned.hybridize()
    pruned(X, xl)
    pruned.prune(every_other_layers(2, 1))  # trained with p = 1 - r/N = 0.5, keep block 0
    one.embed.weight.set_data(full.embed.weight.data())
    for a, b in zip(one.blks[0].collect_params().values(), full.blks[0].collect_params().values()):
        a.set_data(b.data())
    assert_close(pruned(X, xl), one(X, xl), tol=1e-6)  # hybridized vs imperative


@pytest.mark.parametrize("hybridize", [False, True])
def test_drophead_rate_and_scaling(hybridize):
    batch, heads, d = 200, 4, 8
    mha = VariantMultiHeadAttention(d, heads, 0.0, drophead=0.5)
    plain = d2t.MultiHeadAttention(d, heads, 0.0)
    X = np.array(onp.random.RandomState(0).randn(batch, 3, d), dtype="float32")
    for m in (mha, plain):
        m.initialize()
        m(X, X, X)
    copy_params(plain, mha)
    for m in (mha, plain):  # W_o = identity: the output is the concatenated heads
        m.W_o.weight.set_data(np.eye(d))
    if hybridize:
        mha.hybridize()
    ref = plain(X, X, X).reshape(batch, 3, heads, d // heads)
    assert_close(mha(X, X, X), plain(X, X, X), tol=0)  # inference: nothing dropped
    with autograd.train_mode():
        out = mha(X, X, X).reshape(batch, 3, heads, d // heads)
    dropped = (np.abs(out).sum(axis=(1, 3)) == 0).asnumpy()  # (batch, heads)
    assert 0.45 < dropped.mean() < 0.55  # 800 heads, p = 0.5: sd 0.018
    kept = ~dropped
    assert_close(out.asnumpy().transpose(0, 2, 1, 3)[kept],
                 2 * ref.asnumpy().transpose(0, 2, 1, 3)[kept], tol=1e-5)


def test_drophead_v_schedule():
    assert [drophead_schedule(s, 10, 0.2) for s in (0, 5, 10)] == [0.2, 0.0, 0.2]
    assert drophead_schedule(2.5, 10, 0.2) == pytest.approx(0.1)
    mha = VariantMultiHeadAttention(8, 2, 0.0, drophead=0.2)
    mha.set_drophead(0.0)
    mha.initialize()
    mha.hybridize()
    X = np.array(onp.random.RandomState(0).randn(50, 3, 8), dtype="float32")
    with autograd.train_mode():  # rate 0 at mid-schedule: training drops nothing
        assert_close(mha(X, X, X), mha(X, X, X), tol=0)
    mha.set_drophead(0.5)  # the cached graph is rebuilt with the new rate
    with autograd.train_mode():
        assert not bool((mha(X, X, X) == mha(X, X, X)).all())
    with pytest.raises(ValueError):
        VariantMultiHeadAttention(8, 2, 0.0).set_drophead(0.1)


@pytest.mark.parametrize("hybridize", [False, True])
def test_fused_qkv_equals_separate(hybridize):
    sep = d2t.build_model(CFG, V_SRC, V_TGT)
    fused = d2t.build_model(CFG.replace(fused_qkv=True), V_SRC, V_TGT)
    _run(sep), _run(fused)
    assert fused.encoder.blks[0].attention.W_qkv.weight.shape == (3 * D, D)
    fuse_qkv_params(sep, fused)
    X, Y, xl, yl = _batch()
    graph = ModelGraph(fused)
    if hybridize:
        graph.hybridize()
    assert_close(graph(X, Y, xl), sep(X, Y, xl)[0], tol=1e-5)
    # the chapter's stateful call too (decoder cache: keys differ from queries)
    a, _ = sep(X, Y, xl, yl)
    b, _ = fused(X, Y, xl, yl)
    assert_close(a, b, tol=1e-5)


def _saved(tmp_path, name, seed):
    mx.random.seed(seed)
    model = d2t.build_model(CFG, V_SRC, V_TGT)
    _run(model)
    path = str(tmp_path / name)
    model.save_parameters(path)
    return model, path


def test_average_identical_and_different_checkpoints(tmp_path):
    m1, p1 = _saved(tmp_path, "a.params", 1)
    _, p1b = _saved(tmp_path, "a2.params", 1)
    m2, p2 = _saved(tmp_path, "b.params", 2)
    out = str(tmp_path / "avg.params")
    assert average_checkpoints([p1, p1b], out) == [p1, p1b]
    for name, arr in mx.nd.load(out).items():
        assert_close(arr, mx.nd.load(p1)[name], tol=0)
    average_checkpoints([p2, p1, p2], out, last=2)  # the last two: p1 and p2
    w1, w2 = mx.nd.load(p1), mx.nd.load(p2)
    for name, arr in mx.nd.load(out).items():
        assert_close(arr, (w1[name].asnumpy() + w2[name].asnumpy()) / 2, tol=1e-6)
    loaded = d2t.build_model(CFG, V_SRC, V_TGT)
    loaded.load_parameters(out)  # a loadable Gluon parameter file
    assert not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]


def test_classifier_above_chance(ctx):
    vocab, train_iter, test = load_data_lang_id(64, 10, num_examples=600)
    model = TransformerClassifier(d2t.TransformerEncoder(len(vocab), 16, 32, 2, 1, 0.1), 2)
    model.hybridize()
    summary = train_classifier(model, train_iter, 0.005, 2, ctx)
    assert summary["train_acc"] > 0.7
    assert accuracy(model, *test) > 0.8  # chance is 0.5 (balanced: both sides of each pair)


def test_average_model_dirs(tmp_path):
    from d2l_transformer import checkpoint
    from d2l_transformer.contrib.averaging import average_model_dirs
    src_vocab = tgt_vocab = d2t.Vocab([["a", "b"]], reserved_tokens=d2t.data.RESERVED_TOKENS)
    dirs = []
    for seed in (1, 2):
        mx.random.seed(seed)
        model = d2t.build_model(CFG, len(src_vocab), len(tgt_vocab))
        model.initialize()
        X = np.zeros((1, 3))
        model(X, X, np.array([3]), np.array([3]))
        dirs.append(checkpoint.save(str(tmp_path / f"m{seed}"), model, src_vocab, tgt_vocab, CFG))
    out = average_model_dirs(dirs, str(tmp_path / "avg"))
    model, *_ = checkpoint.load(out)
    a, b = (mx.nd.load(str(tmp_path / f"m{s}" / checkpoint.PARAMS)) for s in (1, 2))
    got = {k: v.data() for k, v in model._collect_params_with_prefix().items()}
    assert set(a) <= set(got) and len(a) > 10
    for name, value in got.items():
        if name in a:
            assert_close(value, (a[name].asnumpy() + b[name].asnumpy()) / 2, tol=1e-6)


@pytest.mark.slow
def test_compare_variants_quick(tmp_path):
    """scripts/compare_variants.py --quick: every variant trains, is decoded and scored."""
    import json
    import math
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "compare_variants.py"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--out", str(tmp_path),
                           "--json", str(tmp_path / "v.json")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "v.json").read_text())
    names = [v["variant"] for v in result["variants"]]
    assert len(names) == 7 and names[0] == "chapter (post-norm)"
    for v in result["variants"]:
        run = v["runs"][0]
        assert math.isfinite(run["loss"]) and 0 < run["loss"] < 1
        assert 0 <= run["bleu"] <= 100 and run["heldout_pairs"] == 20
    assert (tmp_path / "loss_curves.png").stat().st_size > 1000
    assert "| fused QKV |" in proc.stdout
