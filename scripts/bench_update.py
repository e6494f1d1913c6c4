"""Adam's update in one operator (`kernels.adam`) against MXNet's multi_adamw_update, in a
preset's training step on this CPU: one process, a synthetic batch of the preset's largest
shape (`training.probe.synthetic_batch`), a fast-path step per precision and update, the four
in interleaved rounds after a warm-up, medians and the median of the per-round ratios.

    python scripts/bench_update.py --preset hour [--rounds 5] [--json FILE]

The "before" rows run the package as it does without the kernel (`kernels.adam` declines, so
`ClipAdam` calls multi_adamw_update in chunks of 50), on the same graph and kernels otherwise.
"""

import argparse
import json
import statistics


def _rows(cfg, size, precisions):
    """``{(precision, update): step}``: a training step of a new model per combination."""
    from d2l_transformer.training import probe
    return {(p, u): probe.training_step(cfg, size, size, p)
            for p in precisions for u in ("fused", "multi_adamw_update")}


def _timed(step, batch, update, kernels, fused_adam):
    """Seconds of one step, its update the kernel's (``fused``) or multi_adamw_update's."""
    from d2l_transformer.training import probe
    kernels.adam = fused_adam if update == "fused" else (lambda *a, **k: False)
    try:
        return probe.timed(step, batch)
    finally:
        kernels.adam = fused_adam


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="hour")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--precisions", default="float32,bfloat16")
    p.add_argument("--json", default=None, metavar="FILE")
    args = p.parse_args(argv)
    # the package first: its step before MXNet loads
    from d2l_transformer import kernels  # noqa: I001
    from d2l_transformer._runtime import cpu_math, threads
    from d2l_transformer.config import PRESETS
    from d2l_transformer.training import precision, probe
    import mxnet as mx
    precisions = args.precisions.split(",")
    cfg = PRESETS[args.preset].replace(precision="bfloat16" if "bfloat16" in precisions
                                       else "float32")
    size = cfg.vocab_size or 4000
    chosen, work = precision.settle(cfg, size, mx.cpu())  # before the first kernel
    if chosen.name not in precisions and "bfloat16" in precisions:
        raise SystemExit(f"bfloat16 cannot run here: {chosen.why}")
    count = threads.size_for(work)
    shape = probe.largest_shape(cfg)
    batch = probe.synthetic_batch(shape, size, size)
    steps = _rows(cfg, size, precisions)
    fused_adam, seconds = kernels.adam, {key: [] for key in steps}
    for key, step in steps.items():  # warm-up: tracing, first allocations
        _timed(step, batch, key[1], kernels, fused_adam)
    for r in range(args.rounds):
        for key in list(steps) if r % 2 == 0 else list(steps)[::-1]:
            seconds[key].append(_timed(steps[key], batch, key[1], kernels, fused_adam))
    medians = {key: statistics.median(s) for key, s in seconds.items()}
    result = {"preset": args.preset, "batch": list(shape), "threads": count,
              "cpu": cpu_math.cpu_name(), "kernels": kernels.load(), "rounds": args.rounds,
              "seconds": {f"{p} {u}": s for (p, u), s in seconds.items()},
              "median_seconds": {f"{p} {u}": m for (p, u), m in medians.items()}}
    for prec in precisions:
        before, after = medians[(prec, "multi_adamw_update")], medians[(prec, "fused")]
        per_round = [b / a for a, b in zip(seconds[(prec, "fused")],
                                           seconds[(prec, "multi_adamw_update")])]
        result[f"{prec} speed-up"] = statistics.median(per_round)
        print(f"{prec}: step {before:.3f} s with multi_adamw_update, {after:.3f} s fused "
              f"(median of per-round ratios {statistics.median(per_round):.3f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result["median_seconds"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
