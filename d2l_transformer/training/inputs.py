"""What a training run reads, once: its corpus or corpora and the user's own dev and test sets
(a resumed run's own, which other data may not replace), through the pipeline its config
chooses (`data.load_data`), with the tokenizer a resumed or fine-tuned model keeps; the lines
that say what was read and dropped; and summary.json's record of it."""

from .. import checkpoint
from ..config import resume_overrides
from ..data import (
    format_counts,
    format_lengths,
    load_data,
    read_corpus,
    read_heldout,
)
from ..data.provenance import read_for_model

PARTS = ("valid", "test")


def read_inputs(cfg, data_path, heldout, resume_dir=None, init_from=None, languages=(None, None)):
    """``(corpus, valid, test)``: the corpus (`data.read_corpus`) and the user's own sets
    (`data.read_heldout`; `heldout`: their two files each, or None); a resumed run's
    (`resume_dir`) as its directory records them, each checked against its recorded SHA-256
    (`data.provenance`): `data_path` and `heldout` then give a moved file's new place, and
    other data is a one-line DataError. A fine-tuned (`init_from`) or resumed model's data must
    hold its languages (`data.provenance.read_for_model`; `languages`: the user's flags)."""
    if resume_dir:
        recorded = checkpoint.trained_heldout(resume_dir, dict(zip(PARTS, heldout)))
        corpus = checkpoint.trained_data(resume_dir, data_path, languages, "--resume")
        return corpus, recorded["valid"], recorded["test"]
    corpus = read_for_model(data_path, cfg.pair, languages, init_from, "--init-from") \
        if init_from else read_corpus(data_path, cfg.source_lang, cfg.target_lang)
    valid, test = (read_heldout(files, *corpus.columns, f"--{part}") if files else None
                   for files, part in zip(heldout, PARTS))
    return corpus, valid, test


def load_inputs(cfg, batch_size, data_path, heldout, *, resume_dir=None, init_from=None, rank=0,
                num_workers=1, fast=False, say=print, languages=(None, None)):
    """``(data, cfg)``: the run's `data.Data` (`read_inputs`, then `data.load_data` with the
    tokenizer of the model resumed or fine-tuned), and `cfg` with what the data decided (its
    languages, ``num_steps``: the longest pair trained on, ``length_ratio``). Says (`say`) in
    a line what was read and dropped, and in another the lengths."""
    origin = resume_dir or init_from
    corpus, valid, test = read_inputs(cfg, data_path, heldout, resume_dir, init_from, languages)
    tokenizer = checkpoint.load_tokenizer(origin, cfg) if origin else None
    vocabs = checkpoint.load_vocabs(init_from) if init_from else None
    data = load_data(cfg, batch_size, corpus, rank=rank, num_workers=num_workers, fast=fast,
                     tokenizer=tokenizer, vocabs=vocabs, valid=valid, test=test)
    lengths = data.report.get("lengths")
    cfg = cfg.replace(source_lang=corpus.source_lang, target_lang=corpus.target_lang,
                      num_steps=lengths["limit"] if lengths else cfg.num_steps,
                      length_ratio=cfg.length_ratio or (lengths["length_ratio"] if lengths else 0.0))
    say(format_counts(data.report["counts"]))
    if data.report.get("note"):
        say(data.report["note"])
    if lengths:
        before = lengths["pairs"] + lengths["over_limit"] + lengths["bad_ratio"]
        say(format_lengths(lengths["limit"], lengths["why"], lengths, before))
    return data, cfg


def data_record(data):
    """summary.json's ``data``: the corpora read (`data.Corpus.describe`), what was dropped, the
    split, the valid and test parts (the user's files, or drawn from the corpus), the lengths
    trained on."""
    report = data.report
    record = dict(data.corpus.describe(), counts=report["counts"])
    record.update({key: report[key] for key in ("split", "valid", "test", "lengths")
                   if key in report})
    return record


def saved_config(directory, overrides, fine_tune=False):
    """The config of a run that resumes (or, `fine_tune`, fine-tunes) the model in
    `directory`: its saved config with `overrides` (`config.resume_overrides`). Fine-tuning
    computes the lengths its data decided, ``num_steps`` and ``length_ratio``, from the new
    data, unless `overrides` set them."""
    saved = checkpoint.load_config(directory)
    if fine_tune:
        lengths = (checkpoint.load_summary(directory).get("data") or {}).get("lengths") or {}
        derived = {"num_steps": 0 if lengths.get("why", "num_steps") != "num_steps" else None,
                   "length_ratio": 0.0 if lengths.get("length_ratio") == saved.length_ratio
                   else None}
        saved = saved.replace(**{k: v for k, v in derived.items()
                                 if v is not None and k not in overrides})
    return resume_overrides(saved, overrides, fine_tune=fine_tune)
