"""Exercises 9.3.9.2 and 9.3.9.3: other positional encodings (``pos_encoding``: none, learned,
ALiBi) and batch normalization (``norm``: batch, masked_batch), d2l_transformer.variants_*."""

import math

import decoding_reference as reference
import mxnet as mx
import numpy as onp
import pytest
from conftest import assert_close
from mxnet import autograd, np

import d2l_transformer as d2t
from d2l_transformer import checkpoint
from d2l_transformer.inference import step as step_module
from d2l_transformer.inference.translator import Translator
from d2l_transformer.variants.norm import PAD_ID, MaskedBatchNorm
from d2l_transformer.variants.position import ALiBiAttention, alibi_slopes

CTX = mx.cpu()
CFG = d2t.TINY.replace(num_layers=2, num_heads=4, embedding_size=16, ffn_hidden_size=32)
OPTIONS = [{"pos_encoding": "none"}, {"pos_encoding": "learned"}, {"pos_encoding": "alibi"},
           {"norm": "batch"}, {"norm": "masked_batch"},
           {"norm": "masked_batch", "pre_norm": True, "pos_encoding": "alibi"}]
NAMES = ["none", "learned", "alibi", "batch", "masked_batch", "masked_prenorm_alibi"]


@pytest.fixture(scope="module")
def data():
    return d2t.load_data_nmt(CFG.batch_size, CFG.num_steps, CFG.num_examples)


def _train(kw, data, fast, epochs=2):
    """The model trained `epochs` epochs from seed 0, and its loss after each epoch."""
    d2t.set_seed(0)
    src_vocab, tgt_vocab, data_iter = data
    model = d2t.build_model(CFG.replace(**kw), len(src_vocab), len(tgt_vocab))
    curve = []
    d2t.train_s2s_ch8(model, data_iter, CFG.lr, epochs, CTX, fast=fast,
                      on_epoch=lambda e, loss: curve.append(loss))
    return model, curve


@pytest.fixture(scope="module")
def trained(data):
    """Each option trained 2 epochs on the fast path (the norms' running statistics set),
    then unhybridized: the references decode imperatively."""
    models = {name: _train(kw, data, True)[0] for name, kw in zip(NAMES, OPTIONS)}
    for model in models.values():
        model.hybridize(False)
    return models


def test_config_refuses_bad_values_in_one_line():
    for changes, words in [({"pos_encoding": "rope"}, "pos_encoding must be one of sincos, none"),
                           ({"norm": "group"}, "norm must be one of layer, scale, batch, "
                                               "masked_batch"),
                           ({"norm": "masked_batch", "edition": "1.0"}, "<pad> at id 1")]:
        with pytest.raises(ValueError) as e:
            d2t.CHAPTER.with_overrides(changes)
        assert words in str(e.value) and "\n" not in str(e.value)
    assert d2t.CHAPTER.with_overrides({"pos_encoding": "alibi", "norm": "masked_batch"})


def test_sincos_is_the_default_model_bit_for_bit(data):
    src_vocab, tgt_vocab, data_iter = data
    X, X_vlen, Y, _ = next(iter(data_iter))
    outs = []
    for cfg in (CFG, CFG.replace(pos_encoding="sincos")):
        d2t.set_seed(0)
        model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
        assert type(model.decoder) is d2t.TransformerDecoder
        model.initialize(mx.init.Xavier(), ctx=CTX)
        outs.append(model(X, Y, X_vlen)[0].asnumpy())
    assert (outs[0] == outs[1]).all()


@pytest.mark.parametrize("kw", OPTIONS, ids=NAMES)
def test_each_option_trains_the_same_on_both_paths(kw, data):
    """Two epochs (13 batches each) imperatively and on the fast graph from the same seed: the
    same losses (float rounding), lower after the second epoch, the running statistics of
    batch norms updated on both."""
    (m_slow, slow), (m_fast, fast) = _train(kw, data, False), _train(kw, data, True)
    assert math.isfinite(fast[0]) and 0 < fast[1] < fast[0]
    assert slow == pytest.approx(fast, rel=1e-4)
    if "norm" in kw:
        for model in (m_slow, m_fast):
            norm = model.encoder.blks[0].addnorm_1.norm
            assert abs(norm.running_mean.data().asnumpy()).max() > 1e-2
        assert_close(m_slow.encoder.blks[0].addnorm_1.norm.running_var.data(),
                     m_fast.encoder.blks[0].addnorm_1.norm.running_var.data(), tol=1e-3)


@pytest.mark.parametrize("name", NAMES)
def test_cached_step_equals_full_decoding(name, trained, data):
    """The translator's step through its key/value cache (newest first) == the decoder's full
    call in prediction mode at every position of a teacher-forced target; greedy translations
    == argmax decoding of the whole prefix and of the chapter's state, step by step."""
    src_vocab, tgt_vocab, _ = data
    model = trained[name]
    sentences = [s.split(" ") for s in ["go .", "i lost .", "he's calm .", "i'm home ."]]
    translator = Translator(model, src_vocab, tgt_vocab, CTX, num_steps=CFG.num_steps,
                            max_length=CFG.num_steps, suppress=False)
    X, valid = translator.encode_source(sentences)
    T = 7
    Y = np.array(onp.random.RandomState(0).randint(3, len(tgt_vocab), size=(len(sentences), T)))
    full = model.decoder(Y, model.decoder.init_state(model.encoder(X, valid), valid))[0]
    encode = step_module.hybridized(step_module.EncoderKV(model))
    step = step_module.hybridized(step_module.DecoderStep(model.decoder))
    kv = step_module.call(encode, X, valid)
    self_kv = [np.zeros((len(sentences), T, kv[0].shape[-1]))] * len(kv)
    for t in range(T):
        caches = []
        for i in range(0, len(kv), 2):
            caches += [self_kv[i], self_kv[i + 1], kv[i], kv[i + 1]]
        logits, *self_kv = step_module.call(step, Y[:, t:t + 1], np.array([t]), valid, *caches)
        assert_close(logits, full[:, t], tol=1e-5)
    for tokens, hyp in zip(sentences, translator.translate(sentences)):
        for mode in ("prefix", "state"):
            assert hyp.tokens == reference.greedy(model, tokens, src_vocab, tgt_vocab,
                                                  CFG.num_steps, CTX, mode=mode)


def test_alibi_slopes_are_the_papers():
    slopes = lambda n: alibi_slopes(mx.nd, np.arange(n), n).asnumpy().tolist()  # noqa: E731
    assert slopes(8) == pytest.approx([2.0 ** -i for i in range(1, 9)])
    assert slopes(4) == pytest.approx([2.0 ** -(2 * i) for i in range(1, 5)])
    assert slopes(6) == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])


def test_alibi_bias_hand_computed():
    """Equal scores (zero queries): head h's weights are softmax(-slope_h * |i - j|); rows are
    example-major (row b * heads + h), as transpose_qkv puts them."""
    att = ALiBiAttention(0.0, 2)
    q, k = np.zeros((4, 3, 2)), np.ones((4, 3, 2))  # 2 examples x 2 heads, 3 positions
    v = np.array(onp.tile(onp.eye(3, dtype="float32"), (4, 1, 1)))  # weights come out as is
    out = att(q, k, v).asnumpy()
    for row in range(4):
        slope = [2.0 ** -4, 2.0 ** -8][row % 2]
        for i in range(3):
            w = onp.exp([-slope * abs(i - j) for j in range(3)])
            onp.testing.assert_allclose(out[row, i], w / w.sum(), rtol=1e-6)
    causal = att(q, k, v, np.array([[1, 2, 3]] * 4)).asnumpy()  # the decoder: j <= i
    onp.testing.assert_allclose(causal[1, 2], out[1, 2], rtol=1e-6)
    assert causal[1, 0].tolist() == [1.0, 0.0, 0.0]


def test_alibi_decoder_self_attention_is_causal(trained, data):
    src_vocab, tgt_vocab, _ = data
    model = trained["alibi"]
    X, valid = np.array([[5, 6, 7, 1, 1]]), np.array([3])
    Y = np.array(onp.random.RandomState(1).randint(3, len(tgt_vocab), size=(1, 6)))
    Y2 = Y.copy()
    Y2[0, 3] = (Y[0, 3] + 1) % len(tgt_vocab)
    logits = [model.decoder(y, model.decoder.init_state(model.encoder(X, valid), valid))[0]
              .asnumpy() for y in (Y, Y2)]
    assert (logits[0][0, :3] == logits[1][0, :3]).all()
    assert abs(logits[0][0, 3:] - logits[1][0, 3:]).max() > 1e-3


def test_none_is_permutation_equivariant(trained):
    """Without positions the encoder cannot tell order: permuted tokens, permuted outputs."""
    encoder = trained["none"].encoder
    X, valid = np.array([[5, 6, 7, 8]]), np.array([4])
    perm = [2, 0, 3, 1]
    assert_close(encoder(X[:, perm], valid), encoder(X, valid)[:, perm], tol=1e-5)


def _backward(loss):
    """``loss.backward()``, then wait for every operator: in a hybridized (static_alloc)
    graph, MXNet 1.9.1 does not order a read of a batch norm's running statistics after the
    backward pass that writes them (pure Gluon shows it: Dense, BatchNorm, Dense), so reading
    them at once may see the old values. `train` waits the same way once an epoch, before it
    validates, averages or saves (training/run.py)."""
    loss.backward()
    mx.nd.waitall()


def _forward(model, X, X_vlen, Y):
    with autograd.record():  # training: the batch's statistics, the running ones updated
        out = model(X, Y, X_vlen)[0]
        loss = out.sum()
    _backward(loss)
    return out.asnumpy()


@pytest.mark.parametrize("norm", ["masked_batch", "batch"])
def test_masked_batch_norm_ignores_padding(norm, data):
    """In training, the real tokens' outputs and the running statistics are the same whether
    the batch is padded to 10 or 20 positions with masked_batch; not so with batch."""
    src_vocab, tgt_vocab, _ = data
    assert src_vocab["<pad>"] == tgt_vocab["<pad>"] == PAD_ID  # what the decoder's mask reads
    lengths = [4, 7, 2]
    outs, stats = [], []
    for width in (10, 20):
        X = onp.full((3, width), PAD_ID, "float32")
        Y = onp.full((3, width), PAD_ID, "float32")
        for b, n in enumerate(lengths):  # the same tokens at each width
            X[b, :n] = onp.random.RandomState(b).randint(3, len(src_vocab), n)
            Y[b, :n] = onp.random.RandomState(10 + b).randint(3, len(tgt_vocab), n)
        d2t.set_seed(0)
        model = d2t.build_model(CFG.replace(norm=norm), len(src_vocab), len(tgt_vocab))
        model.initialize(mx.init.Xavier(), ctx=CTX)
        out = _forward(model, np.array(X), np.array(lengths), np.array(Y))
        outs.append(onp.concatenate([out[b, :n] for b, n in enumerate(lengths)]))
        stats.append(model.decoder.blks[1].addnorm_3.norm.running_var.data().asnumpy())
    diff = max(abs(outs[0] - outs[1]).max(), abs(stats[0] - stats[1]).max())
    assert diff < 1e-4 if norm == "masked_batch" else diff > 1e-2


def test_masked_batch_norm_hand_computed():
    """Training: the real tokens' mean and biased variance; they go into the running
    statistics (momentum 0 here); inference uses those."""
    x = np.array(onp.random.RandomState(0).normal(1, 2, size=(3, 5, 4)).astype("float32"))
    lengths = [5, 2, 3]
    mask = np.array([[float(t < n) for t in range(5)] for n in lengths])
    real = onp.concatenate([x.asnumpy()[b, :n] for b, n in enumerate(lengths)])
    expected = (x.asnumpy() - real.mean(0)) / onp.sqrt(real.var(0) + 1e-5)
    for hybridize in (False, True):
        bn = MaskedBatchNorm(4, momentum=0.0)
        bn.initialize()
        if hybridize:
            bn.hybridize(static_alloc=True, static_shape=True)
        with autograd.record():
            y = bn(x, mask)
            loss = (y * y).sum()
        _backward(loss)
        for b, n in enumerate(lengths):
            onp.testing.assert_allclose(y.asnumpy()[b, :n], expected[b, :n], atol=1e-5)
        onp.testing.assert_allclose(bn.running_mean.data().asnumpy(), real.mean(0), atol=1e-5)
        onp.testing.assert_allclose(bn.running_var.data().asnumpy(), real.var(0), atol=1e-5)
        onp.testing.assert_allclose(bn(x, mask).asnumpy(), expected, atol=1e-5)  # inference


@pytest.mark.parametrize("name", ["learned", "alibi", "masked_batch"])
def test_save_and_load(name, trained, data, tmp_path):
    src_vocab, tgt_vocab, _ = data
    model, kw = trained[name], OPTIONS[NAMES.index(name)]
    checkpoint.save(str(tmp_path / "m"), model, src_vocab, tgt_vocab, CFG.replace(**kw), {})
    loaded, *_ = checkpoint.load(str(tmp_path / "m"))
    X, valid, Y = np.array([[5, 6, 7, 1]]), np.array([3]), np.array([[2, 5, 9]])
    a, b = (m(X, Y, valid)[0] for m in (model, loaded))
    assert_close(a, b, tol=0)


@pytest.mark.slow
def test_exercise_script_quick(tmp_path):
    """scripts/exercise_variants.py --exercise position --quick: every option trains in both
    settings through the CLI, is scored by source length, and the table is printed (~45 s)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "exercise_variants.py"
    proc = subprocess.run([sys.executable, str(script), "--exercise", "position", "--quick",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads((tmp_path / "exercise_position.json").read_text())["runs"]
    assert [(r["setting"], r["option"]) for r in runs] == [
        (s, o) for s in ("chapter", "medium") for o in ("sincos", "none", "learned", "alibi")]
    for r in runs:
        assert all(math.isfinite(v) and v > 0 for v in r["losses"].values())
    medium = [r for r in runs if r["setting"] == "medium"]
    assert all(0 <= r["valid_bleu"] <= 100 and "N+1" in r["bleu_by_length"] for r in medium)
    assert "| alibi |" in proc.stdout and "### medium" in proc.stdout


@pytest.mark.slow
def test_exercise_script_full_setting_quick(tmp_path):
    """The whole-corpus setting's quick form (``--settings full``): valid BLEU with the minutes
    of training before it, and the chapter's option (``layer``) trained once for both
    exercises (OUT/full/default)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "exercise_variants.py"
    for exercise, option in (("norm", "layer"), ("position", "sincos")):
        proc = subprocess.run([sys.executable, str(script), "--exercise", exercise, "--quick",
                               "--settings", "full", "--options", option, "--out",
                               str(tmp_path)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert ("$ train" in proc.stderr) is (exercise == "norm")  # position's reads norm's run
        run, = json.loads((tmp_path / f"exercise_{exercise}.json").read_text())["runs"]
        assert run["setting"] == "full" and 0 <= run["valid_bleu"] <= 100 and run["minutes"] > 0
        assert f"| {option} |" in proc.stdout and "| minutes |" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["default"]
