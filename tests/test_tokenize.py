"""Tokenizers: d2l's words (the chapter), sentencepiece subwords (the full presets), and the
model directory that carries them."""

import pytest

import d2l_transformer as d2t
from d2l_transformer.data import (
    SPM_SRC,
    SPM_TGT,
    SubwordTokenizer,
    TokenizerError,
    WordTokenizer,
    detokenize_words,
    load_tokenizer,
    read_pairs,
)


@pytest.fixture(scope="module")
def pairs():
    return read_pairs(num_examples=None)


@pytest.fixture(scope="module")
def subword(pairs):
    """A small model on 3,000 pairs from the middle of fra.txt (longer sentences than the start)."""
    return SubwordTokenizer.train(pairs.source[60000:63000], pairs.target[60000:63000], 600)


def test_word_tokenizer_is_the_chapters_pipeline():
    tok = WordTokenizer()
    text = "Hi, Tom.\u202fI won!"
    assert tok.encode(text) == d2t.preprocess_nmt(text).split() == ["hi", ",", "tom", ".", "i", "won", "!"]
    assert tok.decode(["va", "!"]) == "va !"  # the chapter's output form, unchanged
    assert tok.lowercase and tok.kind == "word" and tok.files() == {}


def test_detokenize_words_inverts_d2l_on_fra_txt(pairs):
    """Undoing d2l's space before , and . restores 167,078 of the 167,130 lower-cased targets
    exactly; the other 52 lack French's space before ! in fra.txt itself."""
    tok = WordTokenizer()
    same = sum(tok.detokenize(tok.decode(tok.encode(t))) == t.lower() for t in pairs.target)
    assert len(pairs.target) == 167130 and same == 167078
    assert detokenize_words("il a 3 , 5 ans . va !") == "il a 3, 5 ans. va !"


def test_subword_ids_are_the_chapters_vocab_layout(subword):
    for vocab in (subword.src_vocab(), subword.tgt_vocab()):
        assert vocab.to_tokens([0, 1, 2, 3]) == ["<unk>", "<pad>", "<bos>", "<eos>"]
        assert vocab.unk == 0 and vocab["<pad>"] == 1 and vocab["<bos>"] == 2 and vocab["<eos>"] == 3
    vocab = subword.src_vocab()
    assert len(vocab) == subword.src.get_piece_size() == 600
    text = "Do you want me to be your bodyguard?"
    assert vocab[subword.encode(text)] == subword.src.encode(text)  # model ids = sentencepiece ids


@pytest.mark.parametrize("text", [
    "Do you want me to be your bodyguard?",
    "ZYXQV BLORFT, Mr. O'Neill!!! 3.14159 東京 🙂",  # unseen words, scripts and emoji
])
def test_subword_never_unknown_and_cased(subword, text):
    """byte_fallback: any character is spelled in pieces; none is <unk>."""
    pieces = subword.encode(text)
    assert "<unk>" not in pieces and 0 not in subword.src_vocab()[pieces]
    assert subword.src.decode_pieces(pieces) == text  # lossless, case kept


def test_subword_decode_is_detokenized_text(subword):
    text = "Qu'est-ce que tu fais, Émile ? Je suis à la maison."
    pieces = subword.encode_target(text)
    assert subword.decode(pieces) == text and subword.detokenize(text) == text
    assert subword.decode(["<bos>"] + pieces + ["<eos>", "<pad>"]) == text  # control pieces vanish
    assert not subword.lowercase and subword.kind == "subword"


def test_subword_training_is_deterministic_and_small_corpora_fit(pairs):
    a = SubwordTokenizer.train(pairs.source[:500], pairs.target[:500], 4000)
    b = SubwordTokenizer.train(pairs.source[:500], pairs.target[:500], 4000)
    assert a.files() == b.files()
    assert 260 < a.src.get_piece_size() < 4000  # fewer pieces than asked, not an error
    with pytest.raises(TokenizerError, match="^sentencepiece training failed"):
        SubwordTokenizer.train([], [], 100)


def test_load_tokenizer_from_a_model_directory(subword, tmp_path):
    assert isinstance(load_tokenizer(str(tmp_path), d2t.CHAPTER), WordTokenizer)
    cfg = d2t.PRESETS["full"]
    with pytest.raises(TokenizerError, match=f"has no {SPM_SRC}"):
        load_tokenizer(str(tmp_path), cfg)
    for name, data in subword.files().items():
        (tmp_path / name).write_bytes(data)
    loaded = load_tokenizer(str(tmp_path), cfg)
    assert loaded.files() == subword.files()
    assert loaded.encode("Hello there.") == subword.encode("Hello there.")
    (tmp_path / SPM_TGT).write_bytes(b"not a model")
    with pytest.raises(TokenizerError, match="^not a sentencepiece model") as e:
        load_tokenizer(str(tmp_path), cfg)
    assert "\n" not in str(e.value)
    with pytest.raises(TokenizerError, match="unknown tokenizer 'bpe'"):
        load_tokenizer(str(tmp_path), cfg.replace(tokenizer="bpe"))


@pytest.fixture(scope="module")
def full_dir(tmp_path_factory):
    """The `full` preset (subwords) on 600 pairs, one epoch: a model directory."""
    from d2l_transformer.cli import commands as cli
    out = str(tmp_path_factory.mktemp("full") / "model")
    assert cli.main(["train", "--preset", "full", "--max-pairs", "600", "--epochs", "1",
                     "--ctx", "cpu", "--quiet", "--out", out]) == 0
    return out


def test_subword_model_directory_translates_raw_text(full_dir, capsys):
    """The directory carries its sentencepiece models: raw text in any case and script is
    translated, not refused; bad lines keep their one-line errors."""
    import json
    import os

    from d2l_transformer import checkpoint, cli
    manifest = json.loads(open(os.path.join(full_dir, "manifest.json")).read())
    assert SPM_SRC in manifest and SPM_TGT in manifest
    tok = checkpoint.load_tokenizer(full_dir)
    assert tok.kind == "subword"
    capsys.readouterr()
    assert cli.main(["translate", "--engine", "mxnet", "--model", full_dir, "ZYXQV BLORFT 東京 🙂!",
                     "do you want me to be your BODYGUARD?"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and len(captured.out.split("\n")) == 3  # two lines, both translated
    assert "<unk>" not in captured.out
    assert cli.main(["translate", "--engine", "mxnet", "--model", full_dir, "Go.", ""]) == 1
    assert capsys.readouterr().err.strip() == "error: argument 2: empty sentence; skipped"


def test_damaged_sentencepiece_model_is_one_line(full_dir, tmp_path, capsys):
    import shutil

    from d2l_transformer.cli import commands as cli
    copy = tmp_path / "copy"
    shutil.copytree(full_dir, copy)
    (copy / SPM_TGT).write_bytes(b"x" * len((copy / SPM_TGT).read_bytes()))
    assert cli.main(["translate", "--engine", "mxnet", "--model", str(copy), "Go."]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model directory") and SPM_TGT in err and err.count("\n") == 1


def test_config_without_the_new_fields_is_the_chapters_pipeline(tmp_path):
    """config.json of a model directory written before subwords existed: words, book units."""
    import json
    old = json.loads(d2t.PRESETS["full_word"].to_json())
    for field in ("tokenizer", "vocab_size", "loss_reduction", "split_by", "clean",
                  "length_ratio"):
        del old[field]
    cfg = d2t.TransformerConfig.from_json(json.dumps(old))
    assert (cfg.tokenizer, cfg.vocab_size, cfg.loss_reduction) == ("word", 0, "book")
    # and evaluated on the split it was trained on, of the pairs as read; translations of
    # at most max(num_steps, source + 10) tokens, as then
    assert (cfg.split_by, cfg.clean, cfg.length_ratio) == ("pair", False, 0.0)
    assert d2t.TransformerConfig.from_json(d2t.PRESETS["full"].to_json()).split_by == "folded"
    assert isinstance(load_tokenizer(str(tmp_path), cfg), WordTokenizer)
    presets = d2t.PRESETS
    assert [(presets[p].tokenizer, presets[p].loss_reduction) for p in ("chapter", "full", "full_word")] \
        == [("word", "book"), ("subword", "token"), ("word", "token")]
    assert presets["full"].replace(tokenizer="word", vocab_size=0, min_freq=10) == presets["full_word"]


def test_subword_run_resumes_exactly(tmp_path, capsys):
    """A subword run of 1 epoch resumed to 2 (its tokenizer read back from the directory) ends
    with the parameters of an uninterrupted 2-epoch run."""
    import mxnet as mx

    from d2l_transformer.cli import commands as cli
    train = ["train", "--preset", "full", "--max-pairs", "600", "--ctx", "cpu", "--quiet",
             "--seed", "2"]
    whole, part = str(tmp_path / "whole"), str(tmp_path / "part")
    assert cli.main(train + ["--epochs", "2", "--out", whole]) == 0
    assert cli.main(train + ["--epochs", "1", "--out", part]) == 0
    assert (tmp_path / "part" / SPM_SRC).read_bytes() == (tmp_path / "whole" / SPM_SRC).read_bytes()
    assert cli.main(train + ["--epochs", "2", "--out", part, "--resume"]) == 0
    a, b = (mx.nd.load(str(tmp_path / d / "params.params")) for d in ("whole", "part"))
    assert sorted(a) == sorted(b) and all((a[k] == b[k]).asnumpy().all() for k in a)
