"""Each edition's word model exported as it was trained: the exports' manifests describe the
model's own tokenizer (d2l 0.11 spaces off , . !; 0.17 and 1.0 also ?, and end each source with
<eos>), and the programs that use the exports without the package translate like
``d2l-transformer translate --model DIR`` (greedy):

* the CTranslate2 export's README.md snippet, run as written in a process that cannot import
  the package (tests/isolation.py), with the export directory as its working directory;
* scripts/exported_translate.py ``--words`` on the MXNet export, in such a process too.
"""

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import pytest
from isolation import BLOCKER  # noqa: E402  (tests/isolation.py)

from d2l_transformer import checkpoint, cli
from d2l_transformer.config import EDITIONS
from d2l_transformer.inference.export import export
from d2l_transformer.inference.limits import BANNED, EXTRA_LENGTH, decode_limit
from d2l_transformer.training.run import train_model

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "exported_translate.py"
EPOCHS = {"0.11": 10, "0.17": 10, "1.0": 5}  # a few seconds each: models that translate
TEXTS = ["Go.", "I won!", "Who are you?", "Help!", "Are you sure?", "Wait\u202f!", "I'm home.",
         "Who won?", "Is it true?", "Hi."]


def _ctranslate2():
    return pytest.importorskip(
        "ctranslate2", reason="the ctranslate2 extra is not installed (pip install '.[ctranslate2]')")


@pytest.fixture(scope="module", params=sorted(EPOCHS))
def edition(request, tmp_path_factory):
    """``(edition, model directory, its tokenizer)``: the edition's chapter run, a few epochs."""
    model_dir = str(tmp_path_factory.mktemp(f"edition{request.param}") / "model")
    cfg = EDITIONS[request.param].replace(num_epochs=EPOCHS[request.param])
    train_model(cfg, model_dir, ctx=mx.cpu(), progress=False, preset="chapter", log=io.StringIO())
    return request.param, model_dir, checkpoint.load_tokenizer(model_dir)


def _isolated(code, cwd, args=(), stdin=""):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, "-I", "-c", BLOCKER + code, *args], input=stdin,
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _cli_translate(model_dir, texts, capsys):
    """What ``d2l-transformer translate --model DIR TEXT...`` prints, one line a text."""
    capsys.readouterr()
    assert cli.main(["translate", "--engine", "mxnet", "--model", model_dir, *texts]) == 0
    return capsys.readouterr().out.splitlines()


def _check_tokens(manifest, name, tokenizer):
    """The manifest's ``tokens`` is the tokenizer's own rule, and says so in words."""
    rule = tokenizer.rule()
    assert manifest["tokens"]["words"] == rule and rule["edition"] == name
    assert ("?" in rule["marks"]) == (name != "0.11") == (rule["source_end"] == ["<eos>"])
    source = manifest["tokens"]["source"]
    assert (" ? " in source) == ("<eos> appended" in source) == (name != "0.11"), source
    assert (manifest["decoding"]["extra_length"], manifest["decoding"]["banned"]) == (
        EXTRA_LENGTH, list(BANNED))


def test_the_ctranslate2_readme_translates_like_the_cli(edition, tmp_path, capsys):
    _ctranslate2()
    name, model_dir, tokenizer = edition
    out = tmp_path / "ct2"
    manifest = export(model_dir, str(out), format="ctranslate2")
    _check_tokens(manifest, name, tokenizer)
    assert manifest["decoding"]["source"] == manifest["tokens"]["source"]
    readme = (out / "README.md").read_text()
    assert manifest["tokens"]["source"] in " ".join(readme.split())  # its words, wrapped
    snippet = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    texts = json.loads(re.search(r"for text in (\[.*?\])\]", snippet).group(1))
    assert any("?" in t for t in texts)
    run = _isolated(snippet + "print(tokens)\n", cwd=str(out))  # the snippet, then its tokens
    assert run.returncode == 0, run.stderr
    printed, tokens = run.stdout.splitlines()
    assert eval(tokens) == [tokenizer.encode(t) for t in texts]
    assert eval(printed) == _cli_translate(model_dir, texts, capsys)


def test_exported_translate_words_translates_like_the_cli(edition, tmp_path, capsys):
    name, model_dir, tokenizer = edition
    out = tmp_path / "mxnet"
    manifest = export(model_dir, str(out))
    _check_tokens(manifest, name, tokenizer)
    assert ("the tokens end with <eos>" in manifest["decoding"]["source"]) == (name != "0.11")
    run = _isolated(f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')", cwd=str(tmp_path),
                    args=[str(out), "--words"], stdin="\n".join(TEXTS))
    assert run.returncode == 0, run.stderr
    ours = _cli_translate(model_dir, TEXTS, capsys)
    assert run.stdout.splitlines() == ours and len(set(ours)) > 1
    # an export whose manifest predates the rules it now carries: one line, nothing decoded
    old = tmp_path / "old"
    shutil.copytree(out, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["decoding"]["extra_length"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    run = _isolated(f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')", cwd=str(tmp_path),
                    args=[str(old), "--words"], stdin="Go.")
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr == f"error: {old} was exported by an older d2l-transformer: export it again\n"


def test_the_limit_written_out_is_decode_limit():
    from d2l_transformer.inference.export.source import limit_text
    for num_steps in (9, 10, 30):
        for length in range(0, 40):
            assert eval(limit_text(num_steps, "length")) == decode_limit(num_steps, length)
