"""The `d2l-transformer` console script: training with checkpoints and --resume, translating
(bad input: the first few lines one by one, the rest counted by reason; the rest of the input
continues), evaluating, comparing, the help."""

import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import types

import mxnet as mx
import pytest

from d2l_transformer.cli import commands as cli
from d2l_transformer.io import atomic

TRAIN = ["train", "--preset", "tiny", "--ctx", "cpu", "--quiet", "--seed", "3"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("cli") / "model")
    assert cli.main(TRAIN + ["--epochs", "3", "--out", out]) == 0
    return out


def _stdin(monkeypatch, data):
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(data)))


@pytest.mark.slow
def test_resume_ends_with_the_same_parameters(tmp_path, capsys):
    whole, part = str(tmp_path / "whole"), str(tmp_path / "part")
    assert cli.main(TRAIN + ["--epochs", "4", "--out", whole]) == 0
    assert cli.main(TRAIN + ["--epochs", "2", "--out", part]) == 0  # 2 epochs, then 2 more
    capsys.readouterr()
    assert cli.main(TRAIN + ["--epochs", "4", "--out", part, "--resume"]) == 0
    assert "from epoch 3" in capsys.readouterr().err
    a = mx.nd.load(os.path.join(whole, "params.params"))
    b = mx.nd.load(os.path.join(part, "params.params"))
    assert sorted(a) == sorted(b)
    assert all((a[k] == b[k]).asnumpy().all() for k in a)
    assert mx.nd.load(os.path.join(whole, "params.params"))  # sanity: the file is real
    # a different seed is refused rather than silently mixing runs
    assert cli.main(TRAIN[:-1] + ["4", "--epochs", "5", "--out", part, "--resume"]) == 2
    assert "trained with --seed 3, not 4" in capsys.readouterr().err


@pytest.mark.parametrize("flags,fast", [([], True), (["--imperative"], False),
                                        (["--exact-chapter"], False)])
def test_train_path_fast_by_default_imperative_on_request_or_exact(tmp_path, capsys, flags, fast):
    out = str(tmp_path / "m")
    assert cli.main(TRAIN + ["--epochs", "1", "--max-pairs", "200", "--out", out] + flags) == 0
    err = capsys.readouterr().err
    assert ("fast graph path" if fast else "imperative path") in err
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert summary["fast"] is fast and summary["exact_chapter"] is ("--exact-chapter" in flags)


def test_train_has_no_fast_option(tmp_path):
    """The graph path is the default: ``--fast`` is not an option of `train` (exit 2, usage)."""
    with pytest.raises(SystemExit) as e:
        cli.main(TRAIN + ["--fast", "--out", str(tmp_path)])
    assert e.value.code == 2


def test_bug_keeps_its_traceback_user_errors_are_one_line(tmp_path, monkeypatch, capsys):
    """Our own bug (here a ValueError, or an OSError about a file nobody named) prints its
    traceback and exits 3; the same OSError about the --out directory is one line."""
    out = str(tmp_path / "m")
    for error in (ValueError("boom"), FileNotFoundError(2, "No such file", "/nonexistent/internal")):
        def train_model(*args, error=error, **kwargs):
            raise error
        monkeypatch.setattr(cli, "train_model", train_model)
        assert cli.main(TRAIN + ["--out", out]) == cli.EXIT_BUG
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and f"{type(error).__name__}: " in err
        assert err.strip().splitlines()[-1].startswith(f"error: unexpected {type(error).__name__}")

    def unwritable(*args, **kwargs):
        raise PermissionError(13, "Permission denied", os.path.join(tmp_path, ".m.v-0123abcd"))
    monkeypatch.setattr(cli, "train_model", unwritable)
    assert cli.main(TRAIN + ["--out", out]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: [Errno 13] Permission denied") and err.count("\n") == 1
    assert cli.main(TRAIN + ["--out", out, "--epochs", "0"]) == cli.EXIT_ERROR
    assert capsys.readouterr().err == "error: --epochs must be at least 1\n"


def test_translate_arguments_and_heatmaps(model_dir, tmp_path, capsys):
    att = str(tmp_path / "att")
    assert cli.main(["translate", "--engine", "mxnet", "--model", model_dir, "I won!", "Go.", "--beam", "4",
                     "--attention", att]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(out)
    assert sorted(os.listdir(att)) == ["attention_decoder.png", "attention_encoder-decoder.png",
                                       "attention_encoder.png"]


@pytest.mark.parametrize("data,message", [
    (b"go .\n\nhi .\n", "line 2: empty sentence; skipped"),
    (b"go .\nzzz qqq\nhi .\n", "line 2: no word of it is in the model's vocabulary; skipped"),
    (b"go .\n" + b"go " * 1001 + b"\nhi .\n", "line 2: 3003 characters; at most 1000; skipped"),
    (b"go .\n" + b"go " * 201 + b"\nhi .\n", "line 2: 201 tokens; at most 200 (the sentence limit)"),
    (b"go .\n\xff\xfe go\nhi .\n", "line 2: not UTF-8 (invalid start byte at byte 0); skipped"),
])
def test_translate_bad_lines_are_skipped(model_dir, monkeypatch, capsys, data, message):
    _stdin(monkeypatch, data)
    assert cli.main(["translate", "--engine", "mxnet", "--model", model_dir]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == f"error: {message}" or \
        captured.err.strip().startswith(f"error: {message}")
    assert len(captured.err.strip().splitlines()) == 1
    out = captured.out.split("\n")[:3]  # one output line per input line, the bad one empty
    assert out[0] and out[1] == "" and out[2]


def test_translate_random_bytes_said_once(model_dir, monkeypatch, capsys):
    """200 KB of random bytes: a few bad lines one by one, then one line counting the rest by
    reason; still one output line per input line."""
    rng = random.Random(0)
    data = bytes(rng.getrandbits(8) for _ in range(200_000))
    _stdin(monkeypatch, data)
    assert cli.main(["translate", "--engine", "mxnet", "--model", model_dir]) == cli.EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.out.count("\n") == len(data.splitlines())
    err = captured.err.splitlines()
    assert len(err) == 6 and all(re.match(r"error: line \d+: .+; skipped$", e) for e in err[:5])
    summary = re.fullmatch(r"error: ([\d,]+) more lines skipped \(([\d,]+) in all\): (.+)", err[5])
    assert summary, err[5]
    more, total = (int(n.replace(",", "")) for n in summary.group(1, 2))
    counts = dict((reason, int(n.replace(",", ""))) for n, reason in
                  (part.split(" ", 1) for part in summary.group(3).split(", ")))
    assert total == more + 5 and sum(counts.values()) == more and counts["not UTF-8"] > 1000
    assert set(counts) <= {"not UTF-8", "empty", "with no known word", "too long"}
    assert captured.out.split("\n").count("") >= total  # each refused line is an empty one


@pytest.mark.parametrize("engine", ["mxnet", "ctranslate2"])
def test_translate_drops_a_leading_byte_order_mark(model_dir, monkeypatch, capsys, engine):
    """A BOM opening stdin or an argument is no part of the sentence, whichever engine."""
    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2")
    argv = ["translate", "--model", model_dir, "--engine", engine]
    _stdin(monkeypatch, b"\xef\xbb\xbfgo .\ngo .\n")
    assert cli.main(argv) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert first == second
    _stdin(monkeypatch, b"\xef\xbb\xbfgo\n")  # "\ufeffgo" would be a word the model does not know
    assert cli.main(argv) == 0
    assert cli.main(argv + ["\ufeffgo", "go"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == out[1] == out[2] and capsys.readouterr().err == ""


@pytest.mark.slow
def test_translate_into_a_reader_that_stops_ends_quietly(model_dir, tmp_path):
    """``translate < big | head -1``: the closed pipe ends the command with SIGPIPE's status
    (141) and no traceback, not the "bug" status and a traceback."""
    src = tmp_path / "src.txt"
    src.write_text("go .\n" * 20000)
    with open(src) as stdin:
        proc = subprocess.Popen([sys.executable, "-m", "d2l_transformer.cli", "translate",
                                 "--model", model_dir, "--engine", "mxnet"],
                                stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = proc.stdout.readline()
        proc.stdout.close()  # as `head -1` does
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=600) == 141, err
    assert first.strip() and "Traceback" not in err and "Exception ignored" not in err, err


def test_help_names_every_command_without_markup(capsys):
    """The top-level help's text names every command (serve too); no help shows reST markup."""
    commands = ["train", "translate", "evaluate", "score", "launch", "serve", "export", "compare"]
    helps = []
    for argv in [[]] + [[c] for c in commands]:
        with pytest.raises(SystemExit) as e:
            cli.main(argv + ["--help"])
        assert e.value.code == 0
        helps.append(capsys.readouterr().out)
    assert f"{{{','.join(commands)}}}" in helps[0]  # the usage's list: the parser's commands
    text = " ".join(helps[0].split("\n\n")[1].split())  # the paragraph after the usage
    assert all(re.search(rf"\b{c}\b", text) for c in commands), text
    assert not [h for h in helps if "``" in h]


def test_missing_model_dir_and_bad_options(tmp_path, capsys):
    assert cli.main(["translate", "--engine", "mxnet", "--model", str(tmp_path / "nope"), "go ."]) == 2
    assert capsys.readouterr().err.strip() == f"error: model directory {tmp_path / 'nope'} does not exist"
    (tmp_path / "model.params").write_text("not a model directory")
    assert cli.main(["translate", "--engine", "mxnet",
                     "--model", str(tmp_path / "model.params"), "go ."]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {tmp_path / 'model.params'} is a file, not a model directory (give the "
        "directory `train --out` wrote)")
    assert cli.main(["translate", "--engine", "mxnet", "--model", str(tmp_path), "--beam", "0", "go ."]) == 2
    absent = f"gpu:{mx.context.num_gpus()}"  # one past the last GPU
    assert cli.main(["train", "--preset", "tiny", "--ctx", absent, "--out", str(tmp_path)]) == 2
    assert cli.main(["compare", str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 3


@pytest.mark.parametrize("flags, message", [
    (["--exact-chapter", "--set", "pre_norm=true"],
     "the variants (pre_norm) need the corrected Transformer, not exact_chapter"),
    (["--exact-chapter", "--set", "tie_embeddings=target"],
     "the variants (tie_embeddings) need the corrected Transformer, not exact_chapter"),
    (["--architecture", "seq2seq", "--set", "pos_encoding=alibi"],
     "the variants (pos_encoding) need the corrected Transformer, not the seq2seq model")])
def test_variants_of_a_model_without_them_are_one_line(tmp_path, capsys, flags, message):
    """--exact-chapter and --architecture join the config's own check: a variant they cannot
    take is refused in one line before anything trains or is written."""
    out = tmp_path / "m"
    assert cli.main(["train", "--epochs", "1", "--out", str(out)] + flags) == cli.EXIT_ERROR
    assert capsys.readouterr().err == f"error: bad config: {message}\n"
    assert not out.exists()


def test_a_negative_engine_threads_is_one_line(tmp_path, capsys):
    """Checked before anything loads, whichever engine and command."""
    for argv in (["translate", "--model", str(tmp_path), "go ."],
                 ["translate", "--model", str(tmp_path), "--engine", "ctranslate2", "go ."],
                 ["evaluate", "--model", str(tmp_path)], ["serve", "--model", str(tmp_path)]):
        assert cli.main(argv + ["--engine-threads", "-1"]) == cli.EXIT_ERROR, argv
        assert capsys.readouterr().err == "error: --engine-threads must be at least 0\n"
    for name in ("translate", "evaluate", "serve"):  # the help says who reads it
        with pytest.raises(SystemExit):
            cli.main([name, "--help"])
        help_text = " ".join(capsys.readouterr().out.split())
        assert "--engine-threads N --engine ctranslate2: CTranslate2's threads" in help_text
        assert "the mxnet engine ignores it" in help_text


def test_evaluate_and_compare(model_dir, capsys):
    assert cli.main(["evaluate", "--engine", "mxnet",
                     "--model", model_dir, "--max-sentences", "20", "--beam", "2"]) == 0
    out = capsys.readouterr().out
    assert "[greedy] go . => " in out and "bleu " in out
    assert "held-out: lines 201.. of fra.txt: 166927 pairs (2 more, whose source" in out
    assert "training pairs (20 of 201): greedy:" in out and "beam 2:" in out
    # fra.txt's first 20 pairs have 13 distinct sources, up to 3 translations each
    assert "each of its 13 sources once, against all its references (1 to 3): greedy:" in out
    assert "all references' BLEU signature: nrefs:var|" in out
    assert cli.main(["compare", model_dir]) == 0
    table = capsys.readouterr().out
    assert "loss (book units)" in table and "Go ." in table


@pytest.mark.slow
def test_full_preset_tiny_slice(tmp_path, capsys):
    """The full preset's code path (split, buckets, smoothing, warmup) on 600 pairs."""
    out = str(tmp_path / "full")
    assert cli.main(["train", "--preset", "full", "--max-pairs", "600", "--epochs", "1",
                     "--ctx", "cpu", "--quiet", "--out", out]) == 0
    assert cli.main(["evaluate", "--engine", "mxnet",
                     "--model", out, "--max-sentences", "10", "--beam", "2"]) == 0
    text = capsys.readouterr().out
    assert "valid (10 of 59)" in text and "test (10 of 59)" in text  # a tenth, after cleaning


def test_console_script_no_traceback(tmp_path):
    """The installed entry point: one line on stderr and a non-zero exit."""
    exe = os.path.join(os.path.dirname(sys.executable), "d2l-transformer")
    r = subprocess.run([exe, "translate", "--model", str(tmp_path / "x"), "go ."],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------------- --out rules
def _snapshot(root):
    """Every entry under `root`: a file's bytes, a link's target, a directory's mark."""
    entries = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(d, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                entries[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                entries[rel] = "dir"
            else:
                with open(path, "rb") as f:
                    entries[rel] = f.read()
    return entries


def _refused(argv, capsys, root, words):
    before = _snapshot(root)
    assert cli.main(argv) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and words in err, err
    assert _snapshot(root) == before  # nothing touched, byte for byte


def test_out_that_is_not_a_model_directory_is_refused_untouched(tmp_path, monkeypatch, capsys):
    user = tmp_path / "mydir"
    (user / "sub").mkdir(parents=True)
    (user / "notes.txt").write_text("notes")
    (user / "sub" / "data.bin").write_bytes(bytes(range(256)))
    _refused(TRAIN + ["--epochs", "1", "--out", str(user)], capsys, tmp_path,
             "is a directory that is not a model directory")
    _refused(TRAIN + ["--epochs", "1", "--out", str(user), "--overwrite"], capsys, tmp_path,
             "is a directory that is not a model directory")
    _refused(TRAIN + ["--epochs", "1", "--out", str(user / "notes.txt")], capsys, tmp_path,
             "is a file")
    _refused(TRAIN + ["--epochs", "1", "--out", str(user), "--resume"], capsys, tmp_path,
             "has no config.json")
    monkeypatch.chdir(user)  # `--out .` in a directory holding the user's files
    _refused(TRAIN + ["--epochs", "1", "--out", "."], capsys, tmp_path,
             ". is a directory that is not a model directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)  # an empty current directory is not replaced by a link either
    _refused(TRAIN + ["--epochs", "1", "--out", "."], capsys, tmp_path, "current directory")


def test_out_model_directory_is_refused_without_resume_or_overwrite(model_dir, capsys):
    _refused(TRAIN + ["--epochs", "4", "--out", model_dir], capsys, os.path.dirname(model_dir),
             "already holds a trained model: give --resume to continue it, --overwrite")
    with pytest.raises(SystemExit) as e:  # both: a usage error
        cli.main(TRAIN + ["--out", model_dir, "--resume", "--overwrite"])
    assert e.value.code == 2 and "not allowed with argument --resume" in capsys.readouterr().err


def _console(*args):
    """The console script in its own process, as a user runs it (the trainer states a run
    resumes are matched to the parameters by index, so they come from a process of their own)."""
    return subprocess.run([sys.executable, "-m", "d2l_transformer.cli", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_out_model_directory_resumed_or_replaced_on_request(model_dir, tmp_path, capsys):
    out = str(tmp_path / "resumed")
    r = _console(*TRAIN, "--epochs", "1", "--out", out)
    assert r.returncode == 0, r.stderr
    first = json.loads(open(os.path.join(out, "summary.json")).read())
    _refused(TRAIN + ["--epochs", "2", "--out", out], capsys, tmp_path, "already holds")
    r = _console(*TRAIN, "--epochs", "2", "--out", out, "--resume")
    assert r.returncode == 0 and "from epoch 2" in r.stderr, r.stderr
    resumed = json.loads(open(os.path.join(out, "summary.json")).read())
    assert resumed["epoch_history"][:1] == first["epoch_history"] and resumed["epochs_done"] == 2
    out = str(tmp_path / "replaced")  # a plain copy of its files (the oldest layout)
    shutil.copytree(atomic.resolve_dir(model_dir), out)
    assert cli.main(TRAIN[:-1] + ["4", "--epochs", "1", "--out", out, "--overwrite"]) == 0
    replaced = json.loads(open(os.path.join(out, "summary.json")).read())
    assert replaced["seed"] == 4 and replaced["epochs_done"] == 1
    assert os.path.islink(os.path.join(out, "current"))  # migrated to the current layout
    assert not any(n.startswith(".replaced.") for n in os.listdir(tmp_path))
    (tmp_path / "empty").mkdir()  # an empty directory is fine
    assert cli.main(TRAIN + ["--epochs", "1", "--out", str(tmp_path / "empty")]) == 0


def test_the_packages_warnings_are_plain_lines(tmp_path):
    """The console script prints the package's log lines as they are (``NAME: its name says
    ...``), not with the logging module's prefix (``WARNING:d2l_transformer.data.languages:``):
    importing the package leaves the root logger unconfigured for the command line's own."""
    pairs = [f"Go {i}.\tGeh {i} !" for i in range(60)]
    data = tmp_path / "pairs.en-fr.tsv"  # named French, read as German: a logged warning
    data.write_text("\n".join(pairs) + "\n", encoding="utf-8")
    r = _console("train", "--data", str(data), "--source-lang", "en", "--target-lang", "de",
                 "--preset", "tiny", "--epochs", "1", "--ctx", "cpu", "--quiet", "--out",
                 str(tmp_path / "m"))
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert "pairs.en-fr.tsv: its name says en and fr; read as en to de, as --source-lang and " \
        "--target-lang say (the first column is the source)" in lines
    assert not [line for line in lines if line.startswith(("WARNING:", "INFO:"))]
