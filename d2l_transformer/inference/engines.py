"""Translation engines: one interface for the command line, `evaluate` and the server.

``open_engine(model_dir, engine)`` gives an object that translates token lists:
``translate(sentences, beam_size=1, alpha=ALPHA, *, n_best=None)`` -> one `Hypothesis(tokens,
score, log_prob)` per sentence (a list of the n best with ``n_best=n``), the score GNMT's
``log P(Y | x) / ((5 + |Y|) / 6) ** alpha`` with |Y| counting ``<eos>`` (the Transformer paper,
6.1), log_prob the plain ``log P(Y | x)``; ``sample(sentences, topk, temperature, seed)`` -> one
sampled `Hypothesis` each; ``score(sources, targets)`` -> a `scoring.Score` per pair. The
default engine, ``"auto"``, is `choose_engine`'s: CTranslate2 where it runs the model, the
MXNet engine elsewhere (the engine's ``choice`` says which). Both engines also carry the
model's `cfg`, `src_vocab`, `tgt_vocab`, `tokenizer` and `max_positions`, so that the callers
check and tokenize sentences by the package's one rule (`limits`).

* ``"mxnet"`` (`MXNetEngine`): the package's `Translator` over the MXNet model (a model trained
  with ``--exact-chapter``: the chapter's loop, `decode.chapter_greedy`, greedy only); it also
  gives the attention weights of a translation (`MXNetEngine.attention`).
* ``"ctranslate2"`` (`CTranslate2Engine`): OpenNMT's CTranslate2 over the model's float32 export,
  made on first use and kept beside the model directory (`export.kept_export`), converted at
  load to the compute type asked for (`compute_type_for`), on the threads measured fastest on
  this machine (`ct2_threads.best_threads`) unless asked for others. Greedy decoding in float32
  gives the MXNet engine's tokens. Beam search is CTranslate2's (its beam keeps the best partial
  hypotheses by log P, without length penalty); its `beam_size` finished hypotheses are then
  ranked by GNMT's score, as the MXNet engine ranks its own (docs/export.md).
"""

import json
import os

from .. import checkpoint
from ..config import TransformerConfig
from ..data import Vocab
from ..data import load_tokenizer as _tokenizer_of
from .ct2_threads import best_threads
from .decode import chapter_greedy
from .limits import (
    BANNED,
    chapter_only,
    check_lengths,
    check_search,
    decode_limit,
    require_corrected,
    source_positions,
)
from .sampling import check_sampling
from .sampling import sample as _sample
from .scoring import Score, check_pairs, score_pairs
from .translator import ALPHA, Hypothesis, Translator, length_penalty

ENGINES = ("mxnet", "ctranslate2")
AUTO = "auto"  # CTranslate2 where it can run the model, the MXNet engine elsewhere (`choose_engine`)
CHOICES = (AUTO,) + ENGINES
DEFAULT_ENGINE = AUTO
BATCH = 64  # sentences decoded together
COMPUTE_TYPE = "float32"  # CTranslate2's compute type when none is asked for: the export's


class EngineError(ValueError):
    """An engine option that cannot be honoured (a compute type this CPU lacks, an option of
    the other engine); the message is one line."""


def check_engine_options(engine, compute_type=None):
    """EngineError (one line) for CTranslate2's options given to another engine: the one rule
    of `open_engine` and the server."""
    if compute_type is not None and engine not in ("ctranslate2", AUTO):
        raise EngineError(f"--compute-type is an option of --engine ctranslate2, not of "
                          f"--engine {engine}")


def compute_type_for(ctranslate2, compute_type=None, device="cpu"):
    """The compute type CTranslate2 converts the float32 export to at load: `compute_type`
    (None: `COMPUTE_TYPE`), which must be one `ctranslate2.get_supported_compute_types` lists
    for `device` (EngineError, one line, naming them)."""
    if compute_type is None:
        return COMPUTE_TYPE
    supported = sorted(ctranslate2.get_supported_compute_types(device))
    if compute_type not in supported:
        raise EngineError(f"--compute-type {compute_type}: CTranslate2 {ctranslate2.__version__}"
                          f" supports {', '.join(supported)} on this {device.upper()}")
    return compute_type


def no_unk_for(cfg, no_unk=False):
    """Whether translations of a model trained with `cfg` must not contain ``<unk>``: always for
    subword models (a sentencepiece model covers its text, ``<unk>`` only tells that it is
    under-trained), on request (``no_unk``, ``--no-unk``) for word models, whose default is the
    chapter's (the book prints ``Wow ! => <unk> !``)."""
    return bool(no_unk) or cfg.tokenizer == "subword"


def translator_options(cfg, no_unk=False):
    """The `Translator` keywords for a model trained with `cfg`: its `num_steps`, `no_unk_for`,
    and the sources' padding: the chapter's (to `num_steps`) for word models, whose published
    figures were measured so; each batch's longest source for subword models (their
    `num_steps` is 30 while the sentences average ~10 pieces: the encoder masks the padding, so
    the same translations, with less work; the one-hour model's published valid and test
    BLEU and chrF, greedy and beam 4, are unchanged to the last digit)."""
    return {"num_steps": cfg.num_steps, "no_unk": no_unk_for(cfg, no_unk),
            "pad_to_num_steps": cfg.tokenizer != "subword", "length_ratio": cfg.length_ratio}


class MXNetEngine:
    """The package's `Translator` on a loaded model (`MXNetEngine.load`: from a model
    directory). `no_unk`: never emit ``<unk>`` (`no_unk_for`)."""

    name = "mxnet"
    compute_type = intra_threads = None  # CTranslate2's options: not this engine's
    choice = None  # `open_engine`'s line saying why ``auto`` took it

    def __init__(self, model, src_vocab, tgt_vocab, cfg, tokenizer, ctx, *, no_unk=False,
                 batch_size=BATCH):
        self.model, self.src_vocab, self.tgt_vocab, self.cfg = model, src_vocab, tgt_vocab, cfg
        self.tokenizer, self.ctx = tokenizer, ctx
        self.max_positions = source_positions(model)
        self.summary = {}  # summary.json's, when loaded from a model directory
        self.translator = None
        if no_unk:
            require_corrected(cfg, "--no-unk")
        if not chapter_only(cfg):
            self.translator = Translator(model, src_vocab, tgt_vocab, ctx, batch_size=batch_size,
                                         **translator_options(cfg, no_unk))

    @classmethod
    def load(cls, model_dir, ctx=None, **kwargs):
        """The engine of the model directory `model_dir` (CheckpointError: one line)."""
        import mxnet as mx
        ctx = ctx or mx.cpu()
        model, src_vocab, tgt_vocab, cfg, summary = checkpoint.load(model_dir, ctx)
        engine = cls(model, src_vocab, tgt_vocab, cfg, checkpoint.load_tokenizer(model_dir, cfg),
                     ctx, **kwargs)
        engine.summary = summary
        return engine

    def translate(self, sentences, beam_size=1, alpha=ALPHA, *, n_best=None):
        """`Translator.translate`; for an exact-chapter model the chapter's greedy loop (score
        None)."""
        if self.translator is not None:
            return self.translator.translate(sentences, beam_size, alpha, n_best=n_best)
        check_search(beam_size, n_best)
        if beam_size > 1:
            require_corrected(self.cfg, "beam search")
        hyps = [Hypothesis(chapter_greedy(self.model, s, self.src_vocab, self.tgt_vocab,
                                          self.cfg.num_steps, self.ctx), None) for s in sentences]
        return hyps if n_best is None else [[h] for h in hyps]

    def attention(self, src_tokens, tgt_tokens):
        """`Translator.attention`: every layer's and head's weights for a translation."""
        require_corrected(self.cfg, "attention maps")
        return self.translator.attention(src_tokens, tgt_tokens)

    def score(self, sources, targets):
        """`scoring.score_pairs`: each pair's `Score` (teacher forcing)."""
        require_corrected(self.cfg, "scoring")
        return score_pairs(self.translator, sources, targets)

    def sample(self, sentences, topk, temperature=1.0, seed=None):
        """`sampling.sample`: one sampled `Hypothesis` per sentence (NumPy's seed)."""
        require_corrected(self.cfg, "sampling")
        return _sample(self.translator, sentences, topk, temperature, seed)


class CTranslate2Engine:
    """CTranslate2's ``Translator`` over the float32 export kept beside `model_dir`
    (`export.kept_export`: exported on first use, again when the model directory changes).
    ExportError (one line) for an exact-chapter or ScaleNorm model, or without the
    ``ctranslate2`` package. `intra_threads`: CTranslate2's threads (0: the fastest measured
    on this machine, `ct2_threads.best_threads`; the number used: ``self.intra_threads``).
    `compute_type`: CTranslate2's, converted at load (`compute_type_for`: None for the
    export's float32; EngineError for one the CPU lacks; the type used: ``self.compute_type``).

    Greedy in float32 gives the MXNet engine's tokens. Beam search is CTranslate2's own, at its
    own speed: one search, its best hypotheses ranked by its length penalty, ``log P / |Y| **
    alpha``, where the MXNet engine ranks by GNMT's ``((5 + |Y|) / 6) ** alpha`` (the
    translations then differ for some sentences: docs/export.md publishes both engines' BLEU).
    The scores returned are GNMT's in both engines."""

    name = "ctranslate2"
    choice = None  # `open_engine`'s line saying why ``auto`` took it

    def __init__(self, model_dir, *, no_unk=False, batch_size=BATCH, device="cpu",
                 intra_threads=0, compute_type=None):
        if intra_threads < 0:
            raise ValueError(f"intra_threads must be at least 0, not {intra_threads}")
        from .export import kept_export
        from .export.ctranslate2 import import_ctranslate2
        ctranslate2 = import_ctranslate2("--engine ctranslate2")
        self.compute_type = compute_type_for(ctranslate2, compute_type, device)
        self.directory, manifest = kept_export(model_dir)
        self.cfg = TransformerConfig.from_json(json.dumps(manifest["config"]))
        self.src_vocab, self.tgt_vocab = (
            Vocab.from_dict({"idx_to_token": self._read_json(f"{side}_vocabulary.json")})
            for side in ("source", "target"))
        self.tokenizer = _tokenizer_of(self.directory, self.cfg)  # its copies of the spm models
        self.max_positions = manifest["model"]["max_positions"]
        self.summary = {"preset": manifest["model"].get("preset")}
        self.no_unk = no_unk_for(self.cfg, no_unk)
        self.batch_size = batch_size

        def open_translator(threads):
            return ctranslate2.Translator(self.directory, device=device, intra_threads=threads,
                                          compute_type=self.compute_type)
        self.intra_threads = intra_threads or best_threads(
            open_translator, self.src_vocab.idx_to_token, manifest["model"], self.compute_type,
            ctranslate2.__version__)
        self.translator = open_translator(self.intra_threads)
        self._ctranslate2, self._open = ctranslate2, open_translator
        self.compute_type = self.translator.compute_type  # CTranslate2's name: int8 is int8_float32

    def _read_json(self, name):
        with open(os.path.join(self.directory, name), encoding="utf-8") as f:
            return json.load(f)

    def _limit(self, source_length):
        """The package's decode length limit (`limits.decode_limit`), as the `Translator`'s."""
        return decode_limit(self.cfg.num_steps, source_length, self.max_positions,
                            self.cfg.length_ratio)

    def translate(self, sentences, beam_size=1, alpha=ALPHA, *, n_best=None):
        """The same contract as `Translator.translate` (SentenceError naming the sentence for
        one no model can translate); sentences are decoded in groups of one length limit."""
        check_search(beam_size, n_best)
        hyps = self._decode(sentences, alpha, self.translator, beam_size=beam_size,
                            num_hypotheses=n_best or 1)
        return [h[0] for h in hyps] if n_best is None else hyps

    def sample(self, sentences, topk, temperature=1.0, seed=None):
        """One sampled `Hypothesis` per sentence: CTranslate2's ``sampling_topk`` (0: the
        whole vocabulary) and ``sampling_temperature``. With a `seed`, on a translator loaded
        after ``set_random_seed(seed)``: CTranslate2 seeds each of its threads' generators once,
        at the thread's first draw, so only a new translator's draws follow a new seed."""
        check_sampling(topk, temperature)
        translator = self.translator
        if seed is not None:
            self._ctranslate2.set_random_seed(seed)
            translator = self._open(self.intra_threads)
        hyps = self._decode(sentences, ALPHA, translator, beam_size=1, num_hypotheses=1,
                            sampling_topk=topk, sampling_temperature=temperature)
        return [h[0] for h in hyps]

    def score(self, sentences, targets):
        """Each pair's `Score`: CTranslate2's ``score_batch`` (the tokens and ``<eos>``)."""
        sentences, targets = [list(s) for s in sentences], [list(t) for t in targets]
        check_pairs(sentences, targets, self.max_positions, self.max_positions)
        results = self.translator.score_batch(sentences, targets, max_batch_size=self.batch_size,
                                              max_input_length=0)
        return [Score(list(r.tokens), [float(p) for p in r.log_probs]) for r in results]

    def _decode(self, sentences, alpha, translator, **options):
        """`translator`'s ``translate_batch`` with the package's rules (its length limit per group of
        sentences, the banned tokens, ``<unk>``): each sentence's list of `Hypothesis`."""
        sentences = [list(s) for s in sentences]
        check_lengths(sentences, self.max_positions)
        groups = {}
        for i, s in enumerate(sentences):
            groups.setdefault(self._limit(len(s)), []).append(i)
        out = [None] * len(sentences)
        for limit, idx in groups.items():
            results = translator.translate_batch(
                [sentences[i] for i in idx], max_batch_size=self.batch_size,
                length_penalty=alpha, return_scores=True, max_decoding_length=limit,
                min_decoding_length=0, max_input_length=0, disable_unk=self.no_unk,
                suppress_sequences=[[t] for t in BANNED], **options)
            for i, result in zip(idx, results):  # in CTranslate2's order, by its own score
                out[i] = [Hypothesis(list(tokens), *self._score(score, len(tokens), limit, alpha))
                          for tokens, score in zip(result.hypotheses, result.scores)]
        return out

    @staticmethod
    def _score(score, length, limit, alpha):
        """``(GNMT's log P / ((5 + |Y|) / 6) ** alpha, log P)`` of a hypothesis of `length`
        tokens that CTranslate2 scored ``log P / |Y| ** alpha`` (|Y| counts ``<eos>``, which a
        translation cut at the limit does not have)."""
        size = length if length >= limit else length + 1
        log_prob = score * size ** alpha
        return log_prob / length_penalty(size, alpha), log_prob


def choose_engine(model_dir, ctx=None):
    """``(engine, why)``: the engine ``--engine auto`` (the default) takes for the model
    directory `model_dir` on `ctx`: ``"ctranslate2"`` where CTranslate2 is installed, the
    context is the CPU and the model exports (the corrected Transformer with LayerNorm and a
    position table); ``"mxnet"`` elsewhere (the chapter's exact models, the seq2seq models, a
    GPU context), `why` saying which case in a few words."""
    from .export import ExportError
    from .export.ctranslate2 import check
    if ctx is not None and ctx.device_type != "cpu":
        return "mxnet", f"the context is {ctx}; the CTranslate2 engine runs on the CPU"
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return "mxnet", "CTranslate2 is not installed"
    cfg = checkpoint.load_config(model_dir)
    if chapter_only(cfg):
        return "mxnet", "only the chapter's loop decodes this model"
    try:
        check(cfg, None)
    except ExportError as e:
        return "mxnet", f"CTranslate2 cannot run this model ({str(e).split(';')[0]})"
    return "ctranslate2", "the model exports to CTranslate2, the faster engine"


def open_engine(model_dir, engine=DEFAULT_ENGINE, ctx=None, *, no_unk=False, batch_size=BATCH,
                engine_threads=0, compute_type=None):
    """The engine `engine` (`CHOICES`: ``"auto"``, the default, takes `choose_engine`'s) over
    the model directory `model_dir`; `engine_threads`: CTranslate2's (0: measured,
    `ct2_threads.best_threads`), ignored by ``mxnet``; `compute_type`: CTranslate2's
    (`compute_type_for`), refused with ``mxnet``. The engine's ``choice`` is the one line
    saying which ``auto`` took and why (None for an engine asked for by name). Errors are one
    line: CheckpointError, ExactChapterError, EngineError, ExportError (``ctranslate2``)."""
    why = None
    if engine == AUTO:
        engine, why = choose_engine(model_dir, ctx)
        if engine == "mxnet" and compute_type is not None:
            raise EngineError(f"--compute-type is an option of the ctranslate2 engine; {why}")
    check_engine_options(engine, compute_type)
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: use one of {', '.join(CHOICES)}")
    opened = None
    if engine == "ctranslate2":
        from .export import ExportError
        try:
            opened = CTranslate2Engine(model_dir, no_unk=no_unk, batch_size=batch_size,
                                       intra_threads=engine_threads, compute_type=compute_type)
        except ExportError as e:  # the export cannot be kept (a read-only directory, ...)
            if why is None or compute_type is not None:
                raise
            engine, why = "mxnet", f"the CTranslate2 export could not be made: {e}"
    if opened is None:
        opened = MXNetEngine.load(model_dir, ctx, no_unk=no_unk, batch_size=batch_size)
    opened.choice = why and f"engine: {engine} ({why}; --engine mxnet or ctranslate2 forces one)"
    return opened
