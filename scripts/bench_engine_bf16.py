"""Does the MXNet engine (`translate --engine mxnet`) gain from bfloat16 products? A trained
model's test sources translated greedy and with beam 4 by two `Translator`s in one process:
one as `translate` builds it (float32), one whose decoding graphs have their Dense layers and
FFNs replaced by the training path's bfloat16 blocks (`training.bfloat16.CLASSES`, at the
fast graph's seam, `fused._mirror`). Interleaved rounds, medians; the share of the outputs
that differ. AMX is asked for before the first kernel (`cpu_math.allow_amx`), as a bfloat16
training run does (without AMX, oneDNN 2.4's bfloat16 products are slower than float32's).

    python scripts/bench_engine_bf16.py --model DIR [--sentences 2000] [--repeats 3]
"""

import argparse
import json
import os
import statistics
import time


def timed(translator, sentences, beam):
    start = time.perf_counter()
    out = translator.translate(sentences, beam_size=beam)
    return time.perf_counter() - start, [h.tokens for h in out]


def bfloat16_translator(make):
    """A `Translator` from `make()` whose graphs are built with the bfloat16 blocks."""
    from d2l_transformer.inference import step as _step
    from d2l_transformer.training import bfloat16, fused
    translator = make()
    translator.model = _Alias(translator.model)  # its own graphs: the cache is per model
    plain = _step.hybridized

    def hybridized(graph, static=True):
        return plain(fused._mirror(graph, {}, bfloat16.CLASSES), static)
    _step.hybridized = hybridized  # for this process's graphs built from here on
    translator.restore = lambda: setattr(_step, "hybridized", plain)
    return translator


class _Alias:
    """The model under another key (the translator's graph cache is keyed by the model)."""

    def __init__(self, model):
        self.__dict__["_model"] = model

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args):
        return self._model(*args)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, metavar="DIR")
    p.add_argument("--sentences", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, metavar="FILE")
    args = p.parse_args(argv)
    from bench_common import MODEL_ENV, sizes
    from bench_decoding import translation_setup
    os.environ[MODEL_ENV] = os.path.abspath(args.model)
    # the package first: it configures MXNet's threads
    from d2l_transformer._runtime import cpu_math  # noqa: I001
    from d2l_transformer.inference.engines import translator_options
    from d2l_transformer.inference.translator import Translator
    import mxnet as mx
    model, src_vocab, tgt_vocab, cfg, sentences = translation_setup(sizes(False))
    sentences = sentences[:args.sentences]
    amx = cpu_math.allow_amx()  # after the load settled the CPU math, before the first kernel

    def make():
        return Translator(model, src_vocab, tgt_vocab, mx.cpu(), **translator_options(cfg))
    engines = {"float32": make()}
    for beam in (1, 4):  # float32's graphs first, then the bfloat16 ones (hybridized swapped)
        engines["float32"].translate(sentences[:64], beam_size=beam)
    engines["bfloat16"] = bfloat16_translator(make)
    for beam in (1, 4):
        engines["bfloat16"].translate(sentences[:64], beam_size=beam)
    engines["bfloat16"].restore()
    report = {"amx": amx, "isa_cap": os.environ.get(cpu_math.ISA_CAP[0]),
              "sentences": len(sentences), "beams": {}}
    for beam in (1, 4):
        times, outs = {"float32": [], "bfloat16": []}, {}
        for r in range(args.repeats):
            for name in (("float32", "bfloat16") if r % 2 == 0 else ("bfloat16", "float32")):
                seconds, outs[name] = timed(engines[name], sentences, beam)
                times[name].append(seconds)
        med = {n: statistics.median(t) for n, t in times.items()}
        differ = sum(a != b for a, b in zip(outs["float32"], outs["bfloat16"]))
        report["beams"][beam] = {"seconds": times, "float32_over_bfloat16": med["float32"] / med["bfloat16"],
                                 "outputs_differing": differ}
        print(f"beam {beam}: float32 {med['float32']:.2f} s, bfloat16 {med['bfloat16']:.2f} s "
              f"(medians of {args.repeats}): bfloat16 {med['float32'] / med['bfloat16']:.2f}x; "
              f"{differ} of {len(sentences)} outputs differ", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
