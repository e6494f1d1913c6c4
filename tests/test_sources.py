"""Where pairs come from (`data.sources`): a Tatoeba zip (2 or 3 columns), a TSV file, two
aligned files; the languages from the names or the flags; either direction; every malformed
input a one-line error naming the file and the line; and a model of another pair trained,
translated, evaluated, exported and served in that pair."""

import json
import logging
import os
import zipfile

import pytest

from d2l_transformer import checkpoint
from d2l_transformer.cli import commands as cli
from d2l_transformer.data import DataError, format_counts, open_data, read_corpus, read_data_nmt
from d2l_transformer.data.languages import choose_direction, language_code
from d2l_transformer.data.sources import COMPRESSED
from d2l_transformer.data.tokenize import character_coverage, spm_sample, words_problem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRA = os.path.join(ROOT, "data", "fra-eng.zip")
CREDIT = "CC-BY 2.0 (France) Attribution: tatoeba.org #2877272 (CM) & #1158250 (Wittydev)"


def _fra_lines(n):
    with zipfile.ZipFile(FRA) as z:
        return z.read("fra-eng/fra.txt").decode("utf-8").split("\n")[:n]


def write(path, text):
    """`text` into `path`, compressed as its suffix says (.gz, .xz, .bz2)."""
    opener = COMPRESSED.get(os.path.splitext(str(path))[1], open)
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(text)


def write_formats(tmp_path, pairs, lang="fra"):
    """The same (english, other) pairs as a 3-column and a 2-column Tatoeba zip, a TSV file and
    two aligned files: ``{format: [paths]}``."""
    out = {}
    for name, lines in (("anki3", [f"{e}\t{o}\t{CREDIT}" for e, o in pairs]),
                        ("anki2", [f"{e}\t{o}" for e, o in pairs])):
        path = tmp_path / name / f"{lang}-eng.zip"
        path.parent.mkdir()
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"{lang}.txt", "\n".join(lines) + "\n")
            z.writestr("_about.txt", "about")
        out[name] = [str(path)]
    tsv = tmp_path / f"pairs.en-{language_code(lang)}.tsv"
    tsv.write_text("".join(f"{e}\t{o}\n" for e, o in pairs), encoding="utf-8")
    out["tsv"] = [str(tsv)]
    aligned = []
    for side, code in ((0, "en"), (1, language_code(lang))):
        path = tmp_path / f"train.{code}"
        path.write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
        aligned.append(str(path))
    out["aligned"] = aligned
    return out


def test_the_default_corpus_reads_as_the_chapter_reads_it():
    """fra-eng.zip from English to French is fra.txt's own text, bit for bit (the chapter's
    pipeline and its golden values read it), and French to English is its mirror."""
    with zipfile.ZipFile(FRA) as z:
        raw = z.read("fra-eng/fra.txt").decode("utf-8")
    assert read_data_nmt() == raw == open_data(FRA, "en", "fr").text()
    data = open_data(None, "fr")
    assert (data.source_lang, data.target_lang, data.columns) == ("fr", "en", ("en", "fr"))
    sources, targets = data.pairs()
    assert len(sources) == 167130 and (sources[0], targets[0]) == ("Va !", "Go.")
    assert data.text().split("\n", 1)[0] == "Va !\tGo."


def test_four_formats_give_the_same_pairs(tmp_path):
    pairs = [tuple(line.split("\t")) for line in _fra_lines(300)]
    formats = write_formats(tmp_path, pairs)
    read = {name: open_data(paths) for name, paths in formats.items()}
    for name, data in read.items():
        assert (data.columns, data.source_lang, data.target_lang) == (("en", "fr"), "en", "fr"), name
        assert data.pairs() == ([e for e, _ in pairs], [f for _, f in pairs]), name
        assert open_data(formats[name], "fr").pairs() == ([f for _, f in pairs], [e for e, _ in pairs])


@pytest.mark.parametrize("names, expected", [
    (["deu-eng.zip"], ("en", "de")), (["corpus.de-en.tsv"], ("de", "en")),
    (["rus-eng.tsv"], ("ru", "en")), (["corpus.de-en.tsv.gz"], ("de", "en")),
    (["pairs.tsv"], (None, None)), (["train.ru", "train.en"], ("ru", "en")),
    (["train.ru.gz", "train.en.xz"], ("ru", "en")), (["a.txt", "b.txt"], (None, None)),
    # one code outside a zip names nothing: dev is Domung's code, jpn.txt an unzipped member
    (["jpn.txt"], (None, None)), (["dev.tsv"], (None, None)), (["deu.txt"], (None, None))])
def test_languages_from_the_file_names(tmp_path, names, expected):
    paths = []
    for name in names:
        path = tmp_path / name
        if name.endswith(".zip"):
            with zipfile.ZipFile(path, "w") as z:
                z.writestr(name.split("-")[0] + ".txt", "Hi.\tHallo.\n")
        else:
            write(path, "Hi.\tHallo.\n" if len(names) == 1 else "Hi.\n")
        paths.append(str(path))
    if expected == (None, None):
        with pytest.raises(DataError, match="give --source-lang and --target-lang"):
            open_data(paths)
        data = open_data(paths, "ko", "it")
        assert (data.columns, data.source_lang) == (("ko", "it"), "ko")
    else:
        assert open_data(paths).columns == expected


def test_the_flags_choose_the_direction(caplog):
    columns = ("en", "fr")
    assert choose_direction(columns) == (columns, "en", "fr")
    assert choose_direction(columns, "fra") == (columns, "fr", "en")  # ISO 639-3 normalised
    assert choose_direction(columns, None, "en") == (columns, "fr", "en")
    assert choose_direction(columns, "FR", "EN") == (columns, "fr", "en")
    for args, message in ((("de",), r"holds en and fr, not de \(--source-lang; give both"),
                          (("fr", "fr"), "both fr"), (("en!",), "not a language code")):
        with pytest.raises(DataError, match=message):
            choose_direction(columns, *args)
    # both flags win over the names, with a line saying so; a name of two same languages
    with caplog.at_level(logging.WARNING):
        assert choose_direction(columns, "en", "de", "x.en-fr.tsv") == (("en", "de"), "en", "de")
    assert "x.en-fr.tsv: its name says en and fr; read as en to de" in caplog.text
    with pytest.raises(DataError, match="both columns of a.en and b.en are en"):
        choose_direction(("en", "en"), shown="a.en and b.en")
    assert choose_direction(("en", "en"), "en", "de") == (("en", "de"), "en", "de")


@pytest.mark.parametrize("content, message", [
    (b"Go.\tVa !\nno tab\n", "line 2 has no tab"),
    (b"Go.\tVa !\tx\ty\n", "line 1 has 4 columns, not 2"),
    (b"Go.\tVa !\tnot an attribution\n", "line 1 has 3 columns, not 2"),
    (b"Go.\tVa !\nHi.\tSalut \xe9 !\n", "line 2: not UTF-8"),
    (b"\n \nGo.\tVa !\nHi\n", "line 4 has no tab")])  # blank lines are no pairs, not errors
def test_a_malformed_tsv_is_one_line_naming_the_line(tmp_path, content, message):
    path = tmp_path / "pairs.en-fr.tsv"
    path.write_bytes(content)
    with pytest.raises(DataError) as e:
        open_data(str(path)).pairs()
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_bom_crlf_and_empty_sides(tmp_path):
    path = tmp_path / "pairs.en-fr.tsv"
    path.write_bytes("\ufeffGo.\tVa !\r\nHi.\t \r\nRun!\tCours !\r\n\t\r\n\r\n".encode("utf-8"))
    assert open_data(str(path)).pairs() == (["Go.", "Run!"], ["Va !", "Cours !"])
    corpus = read_corpus(str(path))
    assert corpus.pairs() == (["Go.", "Run!"], ["Va !", "Cours !"])
    assert corpus.counts == {"lines": 5, "empty": 3}  # the final CRLF ends the last, blank line
    assert format_counts(corpus.counts) == \
        "read 2 pairs (5 lines); dropped 3 blank or with an empty side"


def test_aligned_files_and_zips_that_do_not_fit(tmp_path):
    en, fr = tmp_path / "t.en", tmp_path / "t.fr"
    en.write_text("Go.\nHi.\n", encoding="utf-8")
    fr.write_text("Va !\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"t.en has 2 lines but .*t.fr has 1"):
        open_data([str(en), str(fr)]).pairs()
    fr.write_text("Va !\nSalut\t!\n", encoding="utf-8")
    with pytest.raises(DataError, match="t.fr line 2 holds a tab"):
        open_data([str(en), str(fr)]).pairs()
    empty = tmp_path / "deu-eng.zip"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("_about.txt", "about")
    with pytest.raises(DataError, match="holds no text member"):
        open_data(str(empty))
    with pytest.raises(DataError, match="one file .* or two aligned files, not 3"):
        open_data([str(en), str(fr), str(en)])
    with pytest.raises(DataError, match="not found"):
        open_data(str(tmp_path / "missing.tsv"))


def test_the_word_tokenizer_refuses_a_language_without_spaces(tmp_path):
    pairs = [(f"I have {n} apples.", f"私はりんごを{n}個持っています。") for n in range(40)]
    data = open_data(write_formats(tmp_path, pairs, "jpn")["tsv"])
    assert "40 of 40 Japanese (ja) sentences" in words_problem(data)
    assert words_problem(open_data(FRA)) is None
    out = str(tmp_path / "m")
    assert cli.main(["train", "--preset", "tiny", "--data", *data.files, "--ctx", "cpu",
                     "--out", out, "--quiet"]) == cli.EXIT_ERROR
    assert not os.path.exists(out)


def test_sentencepiece_samples_large_corpora_and_covers_cjk():
    assert spm_sample(range(10), 20) == list(range(10))
    sample = spm_sample(range(1000), 100)
    assert len(sample) == 100 and sample == sorted(sample) == spm_sample(range(1000), 100)
    assert character_coverage(["Ça va ?", "Grüße"]) == 1.0
    assert character_coverage(["".join(chr(0x4E00 + i) for i in range(1500))]) == 0.9995


# ------------------------------------------------------------------------------ a whole run
TINY_SUBWORD = ["--set", "tokenizer=subword", "--set", "vocab_size=400", "--set",
                "num_examples=null", "--set", "num_valid=30", "--set", "num_test=30",
                "--set", "min_freq=0", "--set", "num_steps=0"]  # the data decide the length


def _train(data, out, *extra, epochs=1):
    args = ["train", "--preset", "tiny", "--data", *data, "--ctx", "cpu", "--out", out,
            "--quiet", "--epochs", str(epochs), *extra]
    assert cli.main(args) == 0
    return json.load(open(os.path.join(out, "summary.json")))


@pytest.mark.slow
def test_four_formats_train_alike_bit_for_bit(tmp_path):
    """The four formats give the same split, the same vocabularies and the same first-epoch
    loss, bit for bit, words and subwords."""
    pairs = [tuple(line.split("\t")) for line in _fra_lines(1200)]
    formats = write_formats(tmp_path, pairs)
    for extra in ([], TINY_SUBWORD):
        runs = {}
        for name, paths in formats.items():
            out = str(tmp_path / f"{name}-{len(extra)}")
            summary = _train(paths, out, *extra)
            vocabs = [open(os.path.join(out, f)).read() for f in ("src_vocab.json", "tgt_vocab.json")]
            runs[name] = (summary["epoch_history"], vocabs,
                          [c["sha256"] for c in summary["data"]["corpora"]])
        assert len({json.dumps(r) for r in runs.values()}) == 1, runs


# ------------------------------------------------------------------------------ other scripts
# (english, german, russian, japanese, arabic): umlauts, Cyrillic, Japanese without spaces, Arabic
SENTENCES = [
    ("I am happy.", "Ich bin glücklich.", "Я счастлив.", "私は幸せです。", "أنا سعيد."),
    ("The dog is big.", "Der Hund ist groß.", "Собака большая.", "犬は大きいです。", "الكلب كبير."),
    ("We drink water.", "Wir trinken Wasser.", "Мы пьём воду.", "私たちは水を飲みます。", "نحن نشرب الماء."),
    ("She reads a book.", "Sie liest ein Buch.", "Она читает книгу.", "彼女は本を読みます。",
     "هي تقرأ كتابا."),
    ("The weather is nice.", "Das Wetter ist schön.", "Погода хорошая.", "天気がいいです。", "الطقس جميل."),
    ("Where is the station?", "Wo ist der Bahnhof?", "Где вокзал?", "駅はどこですか。", "أين المحطة؟"),
    ("I like green apples.", "Ich mag grüne Äpfel.", "Я люблю зелёные яблоки.", "私は青りんごが好きです。",
     "أحب التفاح الأخضر."),
    ("The children are playing.", "Die Kinder spielen.", "Дети играют.", "子供たちが遊んでいます。",
     "الأطفال يلعبون."),
    ("He works in the city.", "Er arbeitet in der Stadt.", "Он работает в городе.", "彼は町で働いています。",
     "هو يعمل في المدينة."),
    ("The door is open.", "Die Tür ist offen.", "Дверь открыта.", "ドアが開いています。", "الباب مفتوح."),
]
COLUMN = {"de": 1, "ru": 2, "ja": 3, "ar": 4}
ISO3 = {"de": "deu", "ru": "rus", "ja": "jpn", "ar": "ara"}


def _corpus(lang):
    """(english, other) pairs: each sentence with a number, 300 in all (no space before the
    number in Japanese)."""
    gap = "" if lang == "ja" else " "
    return [(f"{s[0]} {n}", f"{s[COLUMN[lang]]}{gap}{n}") for n in range(30) for s in SENTENCES]


@pytest.mark.slow
@pytest.mark.parametrize("lang, fmt, source", [("de", "anki3", "en"), ("ru", "tsv", "ru"),
                                               ("ja", "aligned", "ja"), ("ar", "anki2", "en")])
def test_another_pair_trains_translates_evaluates_exports_and_serves(tmp_path, lang, fmt, source,
                                                                     capsys):
    pytest.importorskip("ctranslate2", reason="pip install 'd2l_transformer[ctranslate2]'")
    libre = pytest.importorskip("libretranslatepy", reason="pip install libretranslatepy")
    from browser import ServerThread
    from test_ctranslate2 import ct2_translate

    from d2l_transformer.inference.engines import MXNetEngine
    from d2l_transformer.inference.export import export
    from d2l_transformer.serve.app import create_app
    from d2l_transformer.serve.engine import Engine

    pairs = _corpus(lang)
    data = write_formats(tmp_path, pairs, ISO3[lang])[fmt]
    target = lang if source == "en" else "en"
    out = str(tmp_path / "model")
    summary = _train(data, out, *TINY_SUBWORD, "--source-lang", source, epochs=8)
    cfg = checkpoint.load_config(out)
    assert cfg.pair == (source, target) and summary["data"]["source_lang"] == source
    side = 0 if source == "en" else 1
    sources = [p[side] for p in pairs[:12]]
    target_chars = set("".join(p[1 - side] for p in pairs)) | {" "}
    capsys.readouterr()
    assert cli.main(["translate", "--engine", "mxnet", "--model", out, "--ctx", "cpu", *sources[:3]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(set(line) <= target_chars for line in lines)  # the target's script

    report = str(tmp_path / "eval.json")
    assert cli.main(["evaluate", "--engine", "mxnet", "--model", out, "--ctx", "cpu", "--max-sentences", "10",
                     "--json", report]) == 0
    scored = json.load(open(report))
    assert (scored["source_lang"], scored["target_lang"]) == (source, target)
    assert [s["name"] for s in scored["sets"]] == ["valid", "test"] and not scored["chapter_sentences"]

    mx_engine = MXNetEngine.load(out)
    tokens = [mx_engine.tokenizer.encode(s) for s in sources]
    ours = [list(h.tokens) for h in mx_engine.translate(tokens)]
    export(out, str(tmp_path / "ct2"), format="ctranslate2")
    assert ct2_translate(tmp_path / "ct2", tokens, cfg) == ours  # CTranslate2's own greedy
    readme = open(tmp_path / "ct2" / "README.md", encoding="utf-8").read()
    names = {"en": "English", "de": "German", "ru": "Russian", "ja": "Japanese", "ar": "Arabic"}
    assert readme.split("\n\n")[1].startswith(f"{names[source]} -> {names[target]}")

    engine = Engine(out, "cpu", engine="mxnet")
    server = ServerThread(create_app(engine))
    try:
        api = libre.LibreTranslateAPI(server.url + "/")
        assert api.languages() == [{"code": source, "name": names[source], "targets": [target]},
                                   {"code": target, "name": names[target], "targets": []}]
        best = [list(h.tokens) for h in mx_engine.translate(tokens[:1], beam_size=4)][0]
        assert api.translate(sources[0], source, target) == mx_engine.tokenizer.decode(best)
        assert api.detect(sources[0]) == [{"confidence": 0.0, "language": source}]
        with pytest.raises(Exception) as e:
            api.translate(sources[0], target, source)  # the other way round: not this model's
        assert e.value.code == 400 and f"translates {source} to {target}" in e.value.read().decode()
    finally:
        server.stop()
        engine.close()
