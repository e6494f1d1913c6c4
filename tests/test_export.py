"""`d2l-transformer export`: MXNet's deployment format, and a reference decoder that needs only
MXNet (scripts/exported_translate.py, run in a process that cannot import the package)
translating token for token as the package does."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import pytest
from isolation import BLOCKER  # noqa: E402  (tests/isolation.py)

import d2l_transformer as d2t
from d2l_transformer import checkpoint, cli
from d2l_transformer.data import heldout_nmt
from d2l_transformer.inference.export import ExportError, export

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "exported_translate.py"
CFG = d2t.TINY.replace(num_layers=2)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A trained TINY model (2 layers) as a model directory, exported; and 50 sentences (the
    chapter's and held-out ones). Tokenizer files: tests/test_ctranslate2.py's subword model."""
    d2t.set_seed(0)
    src_vocab, tgt_vocab, it = d2t.load_data_nmt(CFG.batch_size, CFG.num_steps, CFG.num_examples)
    model = d2t.build_model(CFG, len(src_vocab), len(tgt_vocab))
    d2t.train_s2s_ch8(model, it, CFG.lr, 30, mx.cpu(), fast=True)
    root = tmp_path_factory.mktemp("export")
    model_dir = checkpoint.save(str(root / "model"), model, src_vocab, tgt_vocab, CFG,
                                {"preset": "tiny"})
    out = root / "exported"
    manifest = export(model_dir, str(out))
    held, _ = heldout_nmt(src_vocab, tgt_vocab, CFG.num_examples, 46)["unfiltered"]
    sentences = [s.split() for s in ("go .", "i won !", "he's calm .", "i'm home .")] + held
    return model, src_vocab, tgt_vocab, model_dir, out, manifest, sentences


def _isolated(code, cwd, stdin=""):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, "-I", "-c", BLOCKER + code], input=stdin, cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)


def test_files_manifest_and_graphs(exported):
    _, src_vocab, tgt_vocab, _, out, manifest, _ = exported
    names = {"encoder-symbol.json", "encoder-0000.params", "decoder_step-symbol.json",
             "decoder_step-0000.params", "src_vocab.json", "tgt_vocab.json", "config.json"}
    assert names == set(manifest["files"])  # and each is a link into the version `current` names
    assert names | {"manifest.json"} == set(os.listdir(out / "current")) == {
        n for n in os.listdir(out) if os.path.islink(out / n) and n != "current"}
    assert manifest == json.loads((out / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        data = (out / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert manifest["mxnet_version"] == mx.__version__
    assert manifest["d2l_transformer_version"] == d2t.__version__
    step = manifest["graphs"]["decoder_step"]
    assert [i["name"] for i in step["inputs"]] == [f"data{i}" for i in range(3 + 4 * 2)]
    assert step["outputs"][0]["shape"] == ["rows", len(tgt_vocab)] and len(step["outputs"]) == 5
    assert manifest["special_tokens"]["<pad>"] == src_vocab["<pad>"]
    for graph in ("encoder", "decoder_step"):  # MXNet's own operators only
        symbol = (out / f"{graph}-symbol.json").read_text()
        assert "d2t_" not in symbol and '"op": "_npi_' in symbol


def test_reference_decoder_without_the_package_translates_the_same(exported):
    model, src_vocab, tgt_vocab, _, out, _, sentences = exported
    blocked = _isolated("import d2l_transformer", cwd=str(out.parent))
    assert blocked.returncode != 0 and "is not available in this process" in blocked.stderr
    run = _isolated(f"sys.argv = [{str(SCRIPT)!r}, {str(out)!r}]\n"
                    f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')",
                    cwd=str(out.parent), stdin="\n".join(" ".join(s) for s in sentences))
    assert run.returncode == 0, run.stderr
    theirs = run.stdout.splitlines()
    translator = d2t.Translator(model, src_vocab, tgt_vocab, mx.cpu(), num_steps=CFG.num_steps)
    ours = [" ".join(h.tokens) for h in translator.translate(sentences)]
    assert len(ours) == 50 and len(set(ours)) > 5
    assert theirs == ours


def test_cli_export_and_its_errors(exported, tmp_path, capsys):
    _, src_vocab, tgt_vocab, model_dir, _, _, _ = exported
    out = tmp_path / "x"
    assert cli.main(["export", "--model", model_dir, "--out", str(out)]) == 0
    assert cli.main(["export", "--model", model_dir, "--out", str(out)]) == 0  # replaced
    assert (out / "decoder_step-symbol.json").exists()
    capsys.readouterr()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert cli.main(["export", "--model", model_dir, "--out", str(other)]) == 2
    assert cli.main(["export", "--model", str(tmp_path / "nope"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)
    assert (other / "notes.txt").read_text() == "mine"
    exact = d2t.build_model(CFG.replace(exact_chapter=True), len(src_vocab), len(tgt_vocab))
    exact.initialize(ctx=mx.cpu())
    X = mx.np.ones((1, 2))
    exact(X, X, mx.np.array([2]))  # the deferred shapes
    exact_dir = checkpoint.save(str(tmp_path / "exact"), exact, src_vocab, tgt_vocab,
                                CFG.replace(exact_chapter=True))
    with pytest.raises(ExportError, match="corrected model"):
        export(exact_dir, str(tmp_path / "y"))
