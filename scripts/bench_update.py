"""Adam's update in one operator (`kernels.adam`) against MXNet's multi_adamw_update, in a
preset's training step on this CPU: one process, a synthetic batch of the preset's largest
shape (`training.probe.synthetic_batch`), a fast-path step per precision and update, the four
in interleaved rounds after a warm-up, medians and the median of the per-round ratios; and the
update alone (`ClipAdam`'s call on the model's parameters, given gradients), the same way.

    python scripts/bench_update.py --preset hour [--rounds 5] [--vocab N] [--json FILE]

The "before" rows run the package as it does without the kernel (`kernels.adam` declines, so
`ClipAdam` calls multi_adamw_update in chunks of 50), on the same graph and kernels otherwise.
"""

import argparse
import json
import statistics
import time


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


def _update_alone(cfg, size, kernels, fused_adam, rounds):
    """``{update: [seconds]}``: `ClipAdam`'s call on a new model's parameters (random
    gradients), the kernel's or multi_adamw_update's, alternated, 3 x `rounds` times each."""
    import mxnet as mx
    from mxnet import init

    from d2l_transformer.build import build_model
    from d2l_transformer.training.optim import ClipAdam, config_trainer
    model = build_model(cfg, size, size)
    model.initialize(init.Xavier(), ctx=mx.cpu())
    X = mx.np.ones((2, 5))
    model(X, X, mx.np.array([2, 5]))  # every shape known
    params = [p for p in model.collect_params().values() if p.grad_req != "null"]
    for p in params:
        p.grad()[:] = mx.np.random.normal(size=p.shape) * 1e-3
    update, tokens = ClipAdam(config_trainer(model, cfg), params, 1), mx.nd.array([5000.0])
    seconds = {"fused": [], "multi_adamw_update": []}
    for r in range(3 * rounds + 2):
        for name in list(seconds) if r % 2 == 0 else list(seconds)[::-1]:
            kernels.adam = fused_adam if name == "fused" else (lambda *a, **k: False)
            tic = time.perf_counter()
            update(tokens)
            mx.nd.waitall()
            if r >= 2:  # two warm-ups
                seconds[name].append(time.perf_counter() - tic)
    kernels.adam = fused_adam
    return seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="hour")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--precisions", default="float32,bfloat16")
    p.add_argument("--vocab", type=int, default=None,
                   help="both vocabularies' size (default: the preset's vocab_size, else 4000)")
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
    size = args.vocab or cfg.vocab_size or 4000
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
    alone = _update_alone(cfg, size, kernels, fused_adam, args.rounds)
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
    result["update alone"] = alone
    print("the update alone: " + ", ".join(f"{name} {statistics.median(s) * 1e3:.1f} ms"
                                           for name, s in alone.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result["median_seconds"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
