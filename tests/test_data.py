"""The dataset pipeline, against the d2l library the chapter called, and its error messages."""

import zipfile

import d2l
import numpy as onp
import pytest

import d2l_transformer as d2t
from d2l_transformer.data import BucketBatches, DataError


@pytest.fixture(scope="module")
def text():
    return d2t.read_data_nmt()


def test_chapter_counts(nmt):
    src_vocab, tgt_vocab, data_iter = nmt
    assert (len(src_vocab), len(tgt_vocab), len(data_iter._dataset)) == (180, 162, 1001)
    assert src_vocab.to_tokens([0, 1, 2, 3]) == ["<unk>", "<pad>", "<bos>", "<eos>"]
    assert src_vocab["."] == 4 and src_vocab["go"] == src_vocab.token_to_idx["go"]
    assert tgt_vocab["va"] == tgt_vocab.token_to_idx["va"] and tgt_vocab["zzz-unseen"] == 0


def test_pipeline_equals_d2l(text):
    pre = d2t.preprocess_nmt(text[:50000])
    assert pre == d2l.preprocess_nmt(text[:50000])
    src, tgt = d2t.tokenize_nmt(pre, 1000)
    assert (src, tgt) == d2l.tokenize_nmt(pre, 1000) and len(src) == 1001
    for tokens in (src, tgt):
        ours = d2t.Vocab(tokens, min_freq=3, reserved_tokens=["<pad>", "<bos>", "<eos>"])
        theirs = d2l.Vocab(tokens, min_freq=3, reserved_tokens=["<pad>", "<bos>", "<eos>"])
        assert ours.idx_to_token == theirs.idx_to_token
        assert ours.token_freqs == theirs.token_freqs
    assert d2t.truncate_pad([5, 6, 7], 2, 1) == d2l.truncate_pad([5, 6, 7], 2, 1) == [5, 6]
    assert d2t.truncate_pad([5], 3, 1) == d2l.truncate_pad([5], 3, 1) == [5, 1, 1]
    for is_source in (True, False):
        a, av = d2t.build_array(tgt, ours, 10, is_source)
        b, bv = d2l.build_array(tgt, ours, 10, is_source)
        assert (a == b).all() and (av == bv).all()
    array, valid = d2t.build_array(tgt[:1], ours, 10, False)
    assert array[0, 0] == ours["<bos>"] and int(valid[0]) == len(tgt[0]) + 2


def test_vocab_round_trip():
    v = d2t.Vocab([["a", "b", "b"]], reserved_tokens=["<pad>"])
    w = d2t.Vocab.from_dict(v.to_dict())
    assert w.idx_to_token == v.idx_to_token and w["b"] == v["b"]
    with pytest.raises(ValueError, match="malformed"):
        d2t.Vocab.from_dict({"idx_to_token": ["<unk>", "a", "a"]})


def test_missing_zip_is_one_clear_line(tmp_path):
    path = tmp_path / "nope.zip"
    with pytest.raises(DataError) as e:
        d2t.read_data_nmt(str(path))
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_damaged_zip_is_one_clear_line(tmp_path):
    bad = tmp_path / "fra-eng.zip"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DataError, match="damaged"):
        d2t.read_data_nmt(str(bad))
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("_about.txt", "hi")
        z.writestr("pairs.csv", "a,b")
    with pytest.raises(DataError, match="holds no text member"):
        d2t.read_data_nmt(str(other))


def test_env_variable_points_at_the_data(tmp_path, monkeypatch):
    monkeypatch.setenv("D2L_TRANSFORMER_DATA", str(tmp_path / "elsewhere.zip"))
    with pytest.raises(DataError, match="elsewhere.zip"):
        d2t.load_data_nmt(64, 10)


def test_array_batches_are_the_dataloaders_batches():
    """fast_loader=True: the DataLoader's batches, from the same random draws."""
    gluon_iter = d2t.load_data_nmt(64, 10)[2]
    fast_iter = d2t.load_data_nmt(64, 10, fast_loader=True)[2]
    assert len(fast_iter) == len(gluon_iter) == 16
    for epoch in range(2):
        d2t.set_seed(epoch)
        expected, after_expected = list(gluon_iter), onp.random.rand()
        d2t.set_seed(epoch)
        got, after_got = list(fast_iter), onp.random.rand()
        assert after_got == after_expected  # the same draws from NumPy's RNG
        assert len(got) == len(expected) == 16 and got[-1][0].shape == (1001 - 15 * 64, 10)
        for a, b in zip(got, expected):
            for x, y in zip(a, b):
                assert x.dtype == y.dtype and (x.asnumpy() == y.asnumpy()).all()


def test_preprocess_fast_equals_preprocess_nmt_on_all_of_fra_txt(text):
    assert d2t.data.preprocess_fast(text) == d2t.preprocess_nmt(text)
    assert d2t.data.preprocess_fast(",a.b!\u202f!") == d2t.preprocess_nmt(",a.b!\u202f!") == ",a .b ! !"
    later = d2t.data.punctuation("0.17")  # the later editions also space off "?"
    assert d2t.data.preprocess_fast(text, later) == d2t.preprocess_nmt(text, later)
    assert d2t.data.preprocess_fast("why?", later) == "why ?" != d2t.data.preprocess_fast("why?")


def test_tab_pairs_keep_the_lines_with_one_tab():
    text = "Go.\tVa\u202f!\nno tab here\na\tb\tc\nHi.\tSalut !\n"
    assert list(d2t.data.tab_pairs(text)) == [("Go.", "Va\u202f!"), ("Hi.", "Salut !")]
    assert list(d2t.data.tab_pairs(text, 1, 4)) == [("Hi.", "Salut !")]
    assert d2t.data.plain_spaces("Va\u202f!\xa0") == "Va ! "


def _pairs(n, seed=0, short=False):
    """`n` id sentences (source, target with <bos>=2 ... <eos>=3), lengths 1..12 (2: short)."""
    rng = onp.random.RandomState(seed)

    def length():
        return 2 if short else rng.randint(1, 13)
    src = [list(rng.randint(4, 50, size=length())) for _ in range(n)]
    tgt = [[2] + list(rng.randint(4, 50, size=length())) + [3] for _ in range(n)]
    return src, tgt


def test_bucket_batches_pad_to_their_bucket():
    src, tgt = _pairs(203)
    loader = BucketBatches(src, tgt, 16, 4, 1, 1)
    assert 1 < len(loader.widths) <= 4 and loader.widths == sorted(loader.widths)
    assert loader.widths[-1] == (12, 14)  # the longest source and target fit the last bucket
    d2t.set_seed(0)
    seen, shapes = [], set()
    for X, X_vlen, Y, Y_vlen in loader:
        shapes.add((X.shape[0], X.shape[1], Y.shape[1]))
        assert (X.shape[1], Y.shape[1]) in loader.widths and X.dtype == onp.float32
        for x, xl, y, yl in zip(X.asnumpy(), X_vlen.asnumpy(), Y.asnumpy(), Y_vlen.asnumpy()):
            s, t = [int(v) for v in x[:int(xl)]], [int(v) for v in y[:int(yl)]]
            assert (x[int(xl):] == 1).all() and (y[int(yl):] == 1).all()  # padding beyond
            seen.append((tuple(s), tuple(t)))
    assert sorted(seen) == sorted((tuple(s), tuple(t)) for s, t in zip(src, tgt))  # each once
    assert shapes <= loader.shapes and len(loader.shapes) <= 2 * len(loader.widths)
    d2t.set_seed(0)
    again = [b[0].asnumpy() for b in loader]
    d2t.set_seed(1)
    other = [b[0].asnumpy() for b in loader]
    assert len(again) == len(other) == len(loader)
    assert any(a.shape != b.shape or (a != b).any() for a, b in zip(again, other))  # reshuffled


def test_bucket_batches_give_every_worker_the_same_number_of_steps():
    """Shards of SENTENCES bucketed separately can differ in batch count (a dist_sync hang);
    the list of batches built from all pairs and dealt out cannot."""
    long_src, long_tgt = _pairs(150, 1)
    short_src, short_tgt = _pairs(150, 2, short=True)
    src, tgt = long_src + short_src, long_tgt + short_tgt
    by_halves = [len(BucketBatches(s, t, 8, 6, 1, 1)) for s, t in ((long_src, long_tgt),
                                                                    (short_src, short_tgt))]
    assert by_halves[0] != by_halves[1]  # what sentence shards of different lengths would do
    workers = [BucketBatches(src, tgt, 8, 6, 1, 1, rank=r, num_workers=3) for r in range(3)]
    assert len({len(w) for w in workers}) == 1 and len(workers[0]) == workers[0].num_batches // 3
    batches = []
    for w in workers:
        d2t.set_seed(5)  # the workers seed alike (the CLI's --seed)
        got = [tuple(map(tuple, b[0].asnumpy().tolist())) for b in w]
        assert len(got) == len(w)
        batches.extend(got)
    assert len(set(batches)) == len(batches)  # no batch on two workers
    with pytest.raises(ValueError, match="rank 3 is not in 0..2"):
        BucketBatches(src, tgt, 8, 6, 1, 1, rank=3, num_workers=3)
