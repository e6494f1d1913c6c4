"""`d2l-transformer export --format ctranslate2`: the model in CTranslate2 (an engine no one
here wrote) scores and translates as the package does.

* every variant CTranslate2 can express: its per-token log-probabilities of given
  translations (``score_batch``) equal ours to 1e-4 (random weights, no training);
* trained models (a small subword model, the chapter preset): greedy translations of held-out
  sentences equal the `Translator`'s token for token, with the options the export's README
  gives (the README's own snippet runs in a process without the package); beam 4 with no length
  penalty equal wherever the two searches keep the same hypotheses, and where not, CTranslate2's
  hypothesis is at least as probable under our model (a search difference, not a model one);
* int8 loads and translates (its BLEU delta is in docs/export.md, not asserted);
* what cannot be exported is refused in one line, and nothing that is not an export is replaced.
"""

import hashlib
import io
import json
import os
import re
import subprocess
import sys

import mxnet as mx
import numpy as onp
import pytest
from isolation import BLOCKER  # noqa: E402  (tests/isolation.py)
from mxnet import np, npx

import d2l_transformer as d2t
from d2l_transformer import checkpoint, cli
from d2l_transformer._runtime import threads as _threads
from d2l_transformer.data import heldout_nmt
from d2l_transformer.data.split import split_corpus
from d2l_transformer.evaluate import evaluate_model, translate_texts
from d2l_transformer.inference import ct2_threads
from d2l_transformer.inference.engines import (
    ENGINES,
    CTranslate2Engine,
    MXNetEngine,
    open_engine,
)
from d2l_transformer.inference.export import ExportError, export
from d2l_transformer.inference.export.ctranslate2 import decoding_options
from d2l_transformer.inference.limits import BANNED, EXTRA_LENGTH, SentenceError
from d2l_transformer.inference.translator import ALPHA
from d2l_transformer.io import atomic, lock
from d2l_transformer.io.manifest import check_manifest
from d2l_transformer.training.run import train_model

ctranslate2 = pytest.importorskip(
    "ctranslate2", reason="the ctranslate2 extra is not installed (pip install '.[ctranslate2]')")

# a small subword model: sentencepiece (400 pieces a side) on 2,000 pairs, held-out test sources
SUBWORD = d2t.TINY.replace(tokenizer="subword", vocab_size=400, num_examples=2000, num_valid=100,
                           num_test=200, num_layers=2, embedding_size=32, ffn_hidden_size=64,
                           batch_size=64, min_freq=0, num_epochs=30, loss_reduction="token")
CHAPTER = d2t.CHAPTER.replace(num_epochs=30)


def ct2_translate(out, sentences, cfg, beam=1, length_penalty=0.0):
    """CTranslate2's best hypothesis for each token list, with the export's decoding options;
    sentences are grouped by length, whose limit is the package's (`limits.decode_limit`)."""
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=2)
    groups = {}
    for i, s in enumerate(sentences):
        groups.setdefault(len(s), []).append(i)
    theirs = [None] * len(sentences)
    for length, idx in groups.items():
        options = {**decoding_options(cfg, length), "beam_size": beam,
                   "length_penalty": length_penalty}
        for i, r in zip(idx, translator.translate_batch([sentences[i] for i in idx], **options)):
            theirs[i] = r.hypotheses[0]
    return theirs


def our_log_probs(model, src_vocab, tgt_vocab, source, target):
    """log P(target + <eos> | source) per token under our model (one teacher-forced pass)."""
    X = np.array([src_vocab[source]])  # (1, n)
    valid = np.array([len(source)])  # (1,)
    Y = np.array([[tgt_vocab["<bos>"]] + tgt_vocab[target]])  # (1, m + 1)
    enc_outputs = model.encoder(X, valid)  # (1, n, d)
    logits, _ = model.decoder(Y, model.decoder.init_state(enc_outputs, valid))  # (1, m + 1, V)
    log_probs = npx.log_softmax(logits)[0]  # (m + 1, vocab)
    ids = tgt_vocab[target] + [tgt_vocab["<eos>"]]
    return log_probs.asnumpy()[onp.arange(len(ids)), ids]


# ------------------------------------------------------------------ every variant, exactly
VARIANTS = {
    "chapter": {},
    "pre_norm": {"pre_norm": True},
    "fixnorm": {"fixnorm": True},
    "fused_qkv": {"fused_qkv": True},
    "pre_norm+fixnorm+fused_qkv": {"pre_norm": True, "fixnorm": True, "fused_qkv": True},
    "layerdrop+drophead, 3 layers": {"layerdrop": 0.2, "drophead": 0.2, "num_layers": 3},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_scores_equal_ours_for_every_variant(variant, nmt, tmp_path):
    src_vocab, tgt_vocab, _ = nmt
    cfg = d2t.CHAPTER.replace(**VARIANTS[variant])
    model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
    model.initialize(mx.init.Xavier(magnitude=3))
    X = np.ones((1, 2))
    model(X, X, np.array([2]))  # the deferred shapes
    model_dir = checkpoint.save(str(tmp_path / "model"), model, src_vocab, tgt_vocab, cfg)
    manifest = export(model_dir, str(tmp_path / "ct2"), format="ctranslate2")
    assert manifest["model"]["pre_norm"] == cfg.pre_norm
    pairs = [("go .", "va !"), ("i won !", "j'ai gagné !"), ("he's calm .", "il est calme ."),
             ("i'm home .", "je suis chez moi ."), ("who ran zzyzx ?", "qui a couru ?")]
    sources = [s.split() for s, _ in pairs]
    targets = [t.split() for _, t in pairs]
    ct2 = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=2)
    theirs = ct2.score_batch(sources, targets)
    for s, t, r in zip(sources, targets, theirs):
        assert r.tokens == tgt_vocab.to_tokens(tgt_vocab[t]) + ["<eos>"]  # unknown: <unk>
        ours = our_log_probs(model, src_vocab, tgt_vocab, s, t)
        onp.testing.assert_allclose(r.log_probs, ours, rtol=0, atol=1e-4)
        assert ours.min() < -2  # not a degenerate model: the test would see an error


# ------------------------------------------------------------------ trained models
@pytest.fixture(scope="module", params=["subword", "chapter"])
def trained(request, tmp_path_factory):
    """A trained model directory, its float32 CTranslate2 export, and held-out sentences:
    the subword model's test split sources, the chapter preset's first 200 held-out pairs."""
    root = tmp_path_factory.mktemp(request.param)
    cfg = SUBWORD if request.param == "subword" else CHAPTER
    model_dir = str(root / "model")
    train_model(cfg, model_dir, ctx=mx.cpu(), progress=False, preset=request.param)
    model, src_vocab, tgt_vocab, cfg, _ = checkpoint.load(model_dir)
    tokenizer = checkpoint.load_tokenizer(model_dir)
    if request.param == "subword":
        _, _, test = split_corpus(cfg.num_examples, cfg.num_valid, cfg.num_test, by=cfg.split_by)
        sentences = [tokenizer.encode(t) for t in test.source]
    else:
        sentences = heldout_nmt(src_vocab, tgt_vocab, cfg.num_examples, 200)["unfiltered"][0]
    out = root / "ct2"
    export(model_dir, str(out), format="ctranslate2")
    return dict(kind=request.param, model_dir=model_dir, model=model, src_vocab=src_vocab,
                tgt_vocab=tgt_vocab, cfg=cfg, tokenizer=tokenizer, sentences=sentences, out=out)


@pytest.mark.slow
def test_greedy_equals_the_translator_token_for_token(trained):
    t = trained
    translator = d2t.Translator(t["model"], t["src_vocab"], t["tgt_vocab"], mx.cpu(),
                                num_steps=t["cfg"].num_steps, length_ratio=t["cfg"].length_ratio)
    ours = [h.tokens for h in translator.translate(t["sentences"])]
    theirs = ct2_translate(t["out"], t["sentences"], t["cfg"])
    assert len(ours) == len(t["sentences"]) and len({tuple(o) for o in ours}) > 10  # not degenerate
    assert ours == theirs


@pytest.mark.slow
def test_beam_without_length_penalty_equal_where_the_searches_agree(trained):
    """Both rank by log P at α = 0 / length_penalty = 0. The searches differ in one respect:
    a finished hypothesis keeps its place in CTranslate2's list, while in gluonnlp's search
    (ours) it competes with the live beams at every step and can be pushed out."""
    t = trained
    translator = d2t.Translator(t["model"], t["src_vocab"], t["tgt_vocab"], mx.cpu(),
                                num_steps=t["cfg"].num_steps, length_ratio=t["cfg"].length_ratio)
    ours = [h.tokens for h in translator.translate(t["sentences"], beam_size=4, alpha=0.0)]
    theirs = ct2_translate(t["out"], t["sentences"], t["cfg"], beam=4)
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert len(differ) <= len(ours) * 0.03, differ
    for i in differ:
        s = t["sentences"][i]
        p_ours = our_log_probs(t["model"], t["src_vocab"], t["tgt_vocab"], s, ours[i]).sum()
        p_theirs = our_log_probs(t["model"], t["src_vocab"], t["tgt_vocab"], s, theirs[i]).sum()
        assert p_theirs >= p_ours - 1e-4, (i, ours[i], theirs[i], p_ours, p_theirs)


@pytest.mark.slow
def test_the_readme_translates_like_the_package_without_it(trained):
    """The export's README.md: its Python snippet, run in a process that cannot import the
    package, prints what `translate_texts` gives for the same texts."""
    t = trained
    out = t["out"]
    readme = (out / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    texts = json.loads(re.search(r"for text in (\[.*?\])\]", snippet).group(1))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    run = subprocess.run([sys.executable, "-I", "-c", BLOCKER + snippet], cwd=str(out), env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    ours = translate_texts(MXNetEngine(t["model"], t["src_vocab"], t["tgt_vocab"], t["cfg"],
                                       t["tokenizer"], mx.cpu()), texts)
    assert eval(run.stdout) == ours  # the snippet prints a list of strings
    files = {"model.bin", "config.json", "source_vocabulary.json", "target_vocabulary.json",
             "README.md"} | ({"spm_src.model", "spm_tgt.model"} if t["kind"] == "subword" else set())
    manifest = check_manifest(str(out))
    assert set(manifest["files"]) == files and set(os.listdir(out / "current")) == files | {
        "manifest.json"}
    assert manifest["special_tokens"] == {"<unk>": 0, "<pad>": 1, "<bos>": 2, "<eos>": 3}
    config = json.loads((out / "config.json").read_text())
    assert (config["unk_token"], config["bos_token"], config["eos_token"],
            config["decoder_start_token"], config["add_source_eos"]) == (
        "<unk>", "<bos>", "<eos>", "<bos>", False)
    assert json.loads((out / "target_vocabulary.json").read_text()) == t["tgt_vocab"].idx_to_token
    assert f"+ {EXTRA_LENGTH}" in snippet


@pytest.mark.slow
def test_int8_exports_and_translates(trained, tmp_path):
    t = trained
    manifest = export(t["model_dir"], str(tmp_path / "int8"), format="ctranslate2",
                      quantization="int8")
    assert manifest["quantization"] == "int8"
    assert (manifest["files"]["model.bin"]["bytes"]
            < 0.75 * os.path.getsize(t["out"] / "model.bin"))  # 1 byte a weight, not 4
    theirs = ct2_translate(tmp_path / "int8", t["sentences"][:20], t["cfg"])
    assert len(theirs) == 20 and all(isinstance(h, list) for h in theirs)


# ------------------------------------------------------------------ refusals
@pytest.fixture()
def small_dir(nmt, tmp_path):
    src_vocab, tgt_vocab, _ = nmt

    def save(name, cfg):
        model = d2t.build_model(cfg, len(src_vocab), len(tgt_vocab))
        model.initialize()
        X = np.ones((1, 2))
        model(X, X, np.array([2]))
        return checkpoint.save(str(tmp_path / name), model, src_vocab, tgt_vocab, cfg)
    return save


def _snapshot(directory):
    return {name: (open(os.path.join(directory, name), "rb").read(),
                   os.stat(os.path.join(directory, name)).st_mtime_ns)
            for name in sorted(os.listdir(directory))}


def test_refusals_are_one_line_and_touch_nothing(small_dir, tmp_path, capsys, monkeypatch):
    good = small_dir("good", d2t.TINY)
    exact = small_dir("exact", d2t.TINY.replace(exact_chapter=True))
    scale = small_dir("scale", d2t.TINY.replace(norm="scale"))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    before = _snapshot(mine)
    capsys.readouterr()
    out = str(tmp_path / "out")
    for args in (["--model", exact, "--out", out],
                 ["--model", exact, "--out", out, "--format", "mxnet"],
                 ["--model", scale, "--out", out],
                 ["--model", good, "--out", str(mine)],
                 ["--model", good, "--out", str(mine), "--format", "mxnet"],
                 ["--model", good, "--out", good],  # the model directory itself
                 ["--model", good, "--out", out, "--format", "mxnet", "--quantization", "int8"]):
        if "--format" not in args:
            args = args + ["--format", "ctranslate2"]
        assert cli.main(["export", *args]) == 2, args
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 7 and all(line.startswith("error: ") for line in err), err
    assert "--exact-chapter" in err[0] and "--exact-chapter" in err[1]
    assert "no 'scale' norm" in err[2] and "not an export directory" in err[3]
    assert _snapshot(mine) == before
    assert not os.path.lexists(out)
    assert not [n for n in os.listdir(tmp_path) if n.startswith((".mine.", ".out."))]
    checkpoint.load(good)  # still a model directory
    with pytest.raises(ExportError, match="--exact-chapter"):
        export(exact, out, format="ctranslate2")
    # an export is replaced, by either format
    assert cli.main(["export", "--model", good, "--out", out, "--format", "ctranslate2"]) == 0
    assert cli.main(["export", "--model", good, "--out", out, "--format", "mxnet"]) == 0
    assert cli.main(["export", "--model", good, "--out", out, "--format", "ctranslate2",
                     "--quantization", "int16"]) == 0
    assert json.loads(open(os.path.join(out, "manifest.json")).read())["quantization"] == "int16"
    # without the package: one line that says how to install it
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    capsys.readouterr()
    assert cli.main(["export", "--model", good, "--out", out, "--format", "ctranslate2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install" in err[0]


# ------------------------------------------------------------------ --engine ctranslate2
@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A chapter-sized model trained 10 epochs (seconds), and 200 held-out sources."""
    model_dir = str(tmp_path_factory.mktemp("engines") / "model")
    train_model(d2t.CHAPTER.replace(num_epochs=10), model_dir, ctx=mx.cpu(), progress=False,
                preset="chapter", log=io.StringIO())
    src_vocab, tgt_vocab = (checkpoint.load(model_dir)[i] for i in (1, 2))
    sentences = heldout_nmt(src_vocab, tgt_vocab, d2t.CHAPTER.num_examples, 200)["unfiltered"][0]
    return model_dir, sentences


def test_both_engines_give_the_same_greedy_tokens(small):
    model_dir, sentences = small
    ours, theirs = (open_engine(model_dir, name) for name in ENGINES)
    assert (ours.name, theirs.name) == ("mxnet", "ctranslate2")
    a, b = ours.translate(sentences), theirs.translate(sentences)
    assert len({tuple(h.tokens) for h in a}) > 20  # a model that translates
    assert [h.tokens for h in a] == [h.tokens for h in b]
    # the scores are GNMT's in both (CTranslate2's length penalty converted back), to
    # float32 rounding (CTranslate2 computes them with its own kernels)
    onp.testing.assert_allclose([h.score for h in b], [h.score for h in a], rtol=3e-3, atol=1e-4)
    # beam 4: CTranslate2's own search and ranking (its length penalty), exactly what its
    # translate_batch gives; the same best hypothesis as ours for most sentences (GNMT ranks
    # ours), and where the same, the same (GNMT) score
    a, b = ours.translate(sentences, 4, n_best=2), theirs.translate(sentences, 4, n_best=2)
    assert all(len(h) == 2 for h in b)
    raw = [theirs.translator.translate_batch(
        [list(s)], beam_size=4, num_hypotheses=2, length_penalty=ALPHA, min_decoding_length=0,
        max_decoding_length=theirs._limit(len(s)), max_input_length=0,
        disable_unk=theirs.no_unk, suppress_sequences=[[t] for t in BANNED])[0].hypotheses
        for s in sentences]
    assert [[h.tokens for h in x] for x in b] == raw
    same = [(x[0].score, y[0].score) for x, y in zip(a, b) if x[0].tokens == y[0].tokens]
    assert len(same) >= 0.8 * 200, len(same)
    onp.testing.assert_allclose(*zip(*same), rtol=3e-3, atol=1e-4)
    with pytest.raises(SentenceError, match="^sentence 1: empty sentence$"):
        theirs.translate([["go", "."], []])


def test_the_cli_and_evaluate_give_the_same_greedy_output_from_both_engines(small, capsys,
                                                                            monkeypatch):
    model_dir, sentences = small
    texts = [" ".join(s) for s in sentences[:40]]
    outputs = {}
    for name in ENGINES:  # two lines have no known word: skipped (exit 1), an empty line out
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("\n".join(texts).encode())))
        assert cli.main(["translate", "--model", model_dir, "--engine", name]) == 1
        outputs[name] = capsys.readouterr()
    assert outputs["mxnet"].err == outputs["ctranslate2"].err and outputs["mxnet"].err.count("\n") == 2
    lines = outputs["mxnet"].out.splitlines()
    assert len(lines) == 40 and outputs["ctranslate2"].out.splitlines() == lines
    reports = {name: evaluate_model(model_dir, engine=name, beam=4, max_sentences=100)
               for name in ENGINES}
    greedy = [[s["decoders"]["greedy"]["bleu"] for s in r["sets"]] for r in reports.values()]
    assert greedy[0] == greedy[1] and reports["ctranslate2"]["engine"] == "ctranslate2"
    assert all(0 < b for b in greedy[0])
    beam = [s["decoders"]["beam 4"]["bleu"] for s in reports["ctranslate2"]["sets"]]
    assert all(0 < b for b in beam)


def _version(path):
    return atomic.resolve_dir(path)


def test_the_export_is_made_once_kept_in_the_model_directory_and_rebuilt_when_it_changes(
        small, tmp_path):
    import shutil

    model_dir = str(tmp_path / "model")
    shutil.copytree(small[0], model_dir, symlinks=False)  # a copy that followed the links
    kept = tmp_path / "model" / "ctranslate2"  # inside the model directory: copied with it
    first = CTranslate2Engine(model_dir)
    manifest = check_manifest(str(kept))
    key = hashlib.sha256((tmp_path / "model" / "manifest.json").read_bytes()).hexdigest()
    assert manifest["model_manifest_sha256"] == key and manifest["quantization"] == "float32"
    assert first.directory == _version(kept)
    assert CTranslate2Engine(model_dir).directory == first.directory  # reused, not exported
    # where an earlier release kept the export, beside the model: removed once it is replaced
    old = tmp_path / "..model.ctranslate2.v-0123456789abcdef"
    shutil.copytree(first.directory, old)
    os.symlink(old.name, tmp_path / ".model.ctranslate2")
    # the model directory saved again (other weights): the next use exports it again
    model, src_vocab, tgt_vocab, cfg, summary = checkpoint.load(model_dir)
    for p in model.collect_params().values():
        if p.grad_req != "null":
            p.set_data(p.data() * 0.5)
    checkpoint.save(model_dir, model, src_vocab, tgt_vocab, cfg, summary)
    again = CTranslate2Engine(model_dir)
    assert again.directory != first.directory and os.listdir(tmp_path) == ["model"]
    assert check_manifest(str(kept))["model_manifest_sha256"] != key
    ours = open_engine(model_dir, "mxnet").translate(small[1][:50])
    assert [h.tokens for h in again.translate(small[1][:50])] == [h.tokens for h in ours]
    # an int8 export there (ours, but not the float32 the engine reads) is replaced
    export(model_dir, str(kept), format="ctranslate2", quantization="int8")
    assert check_manifest(CTranslate2Engine(model_dir).directory)["quantization"] == "float32"
    # a copy of the model directory takes its export along: reused there, not exported again
    copy, exported = tmp_path / "copy", os.readlink(kept / "current")
    subprocess.run(["cp", "-r", model_dir, str(copy)], check=True)
    shutil.rmtree(model_dir)
    assert CTranslate2Engine(str(copy)).directory == _version(copy / "ctranslate2")
    assert os.readlink(copy / "ctranslate2" / "current") == exported
    assert check_manifest(str(copy / "ctranslate2"))["model_manifest_sha256"] == hashlib.sha256(
        (copy / "manifest.json").read_bytes()).hexdigest()


def test_engine_refusals_are_one_line_and_touch_nothing(small_dir, small, tmp_path, capsys,
                                                        monkeypatch):
    exact = small_dir("exact", d2t.TINY.replace(exact_chapter=True))
    good = small_dir("good", d2t.TINY)
    theirs = tmp_path / "good" / "ctranslate2"  # not ours: never replaced
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    capsys.readouterr()
    for argv in (["translate", "--model", exact, "--engine", "ctranslate2", "go ."],
                 ["evaluate", "--model", exact, "--engine", "ctranslate2"],
                 ["translate", "--model", good, "--engine", "ctranslate2", "go ."]):
        assert cli.main(argv) == 2, argv
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(e.startswith("error: ") for e in err), err
    assert err[0] == (f"error: {exact}: --engine ctranslate2 needs the corrected model; this one "
                      "was trained with --exact-chapter (the book's bugs)") and err[1] == err[0]
    assert err[2] == (f"error: {theirs} is not an export written by d2l-transformer; move it "
                      f"away to keep the CTranslate2 export of {good} there")
    assert os.listdir(theirs) == ["notes.txt"] and (theirs / "notes.txt").read_text() == "mine"
    assert not os.path.lexists(tmp_path / "exact" / "ctranslate2")
    busy = small_dir("busy", d2t.TINY)  # another process exporting it: refused, not waited for
    with lock.locked(str(tmp_path / "busy" / "ctranslate2"), "exported"):
        with pytest.raises(ExportError, match=r"busy/ctranslate2 is being exported by another "
                                              "process"):
            CTranslate2Engine(busy)
    CTranslate2Engine(busy)  # and once it is done, exported
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # without the package
    assert cli.main(["translate", "--model", small[0], "--engine", "ctranslate2", "go ."]) == 2
    assert capsys.readouterr().err == ("error: --engine ctranslate2 needs the ctranslate2 package: "
                                       "pip install 'd2l_transformer[ctranslate2]'\n")


def test_engine_threads_reach_ctranslate2(small, monkeypatch, capsys, tmp_path):
    """``--engine-threads N`` (translate, evaluate, serve) is CTranslate2's ``intra_threads``;
    0 or absent: the count measured on this machine (`ct2_threads.best_threads`,
    tests/test_ctranslate2_options.py). The engine records what it passed."""
    monkeypatch.setenv("D2L_TRANSFORMER_CACHE", str(tmp_path))  # the measurement's cache
    passed, real = [], ctranslate2.Translator

    def recording(*args, **kwargs):
        passed.append(kwargs["intra_threads"])
        return real(*args, **kwargs)
    monkeypatch.setattr(ctranslate2, "Translator", recording)
    model_dir = small[0]
    assert open_engine(model_dir, "ctranslate2", engine_threads=3).intra_threads == passed[-1] == 3
    default = open_engine(model_dir, "ctranslate2").intra_threads
    assert default == passed[-1] and default in ct2_threads.candidates(_threads.physical_cores())
    assert CTranslate2Engine(model_dir, intra_threads=0).intra_threads == default
    with pytest.raises(ValueError, match="at least 0"):
        CTranslate2Engine(model_dir, intra_threads=-1)
    argv = ["--model", model_dir, "--engine", "ctranslate2", "--engine-threads", "2"]
    assert cli.main(["translate", *argv, "go ."]) == 0 and passed[-1] == 2
    assert cli.main(["evaluate", *argv, "--max-sentences", "5", "--beam", "2"]) == 0
    assert passed[-1] == 2
    assert cli.main(["translate", *argv[:-2], "go ."]) == 0 and passed[-1] == default
    capsys.readouterr()
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from d2l_transformer.serve.engine import Engine

    engine = Engine(model_dir, "cpu", engine="ctranslate2", engine_threads=2)
    try:
        assert engine.translator.intra_threads == passed[-1] == 2
    finally:
        engine.close()


def test_the_server_translates_with_ctranslate2_and_explains_with_mxnet(small):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from d2l_transformer.serve.app import create_app
    from d2l_transformer.serve.engine import Engine

    model_dir, sentences = small
    mxnet = open_engine(model_dir, "mxnet")
    texts = [" ".join(s) for s in sentences if any(mxnet.src_vocab[w] for w in s)][:20]
    sentences = [mxnet.tokenizer.encode(t) for t in texts]
    engine = Engine(model_dir, "cpu", engine="ctranslate2")
    try:
        with TestClient(create_app(engine), base_url="http://127.0.0.1:8000") as client:
            assert client.get("/health").json()["model"]["engine"] == "ctranslate2"
            r = client.post("/translate", json={"text": texts, "beam": 1, "attention": True})
            assert r.status_code == 200
            items = r.json()["translations"]
        expected = mxnet.translate(sentences)
        assert [t["translation"] for t in items] == [" ".join(h.tokens) for h in expected]
        for item, s, h in zip(items, sentences, expected):
            assert item["attention"] == mxnet.attention(s, h.tokens)
    finally:
        engine.close()
