"""Rows (h) of scripts/bench.py that bound the training rows: one matrix product at its best,
``n x n`` by ``n x n`` (n = 2048), in MXNet (FullyConnected, oneDNN, the package's threads for
big work and its instruction set for the run's precision: `training.precision.settle`) and in
PyTorch (``torch.matmul``, the same threads), float32 and bfloat16, the best of 10 after 2
warm-up calls, in GFLOP/s (2 n^3 per product). Each returns ``(value, extra figures)``."""

import time

N, QUICK_N, CALLS = 2048, 256, 10  # --quick: a small product (a smoke test, not a figure)


def _best(run, sync):
    """The shortest of `CALLS` timed calls of `run` (after 2 warm-up calls); `sync` waits."""
    for _ in range(2):
        sync(run())
    times = []
    for _ in range(CALLS):
        tic = time.perf_counter()
        sync(run())
        times.append(time.perf_counter() - tic)
    return min(times)


def gemm_row(key, quick=False):
    """``gemm_mxnet_float32``, ``gemm_mxnet_bfloat16``, ``gemm_torch_float32``,
    ``gemm_torch_bfloat16``: GFLOP/s of one n x n x n product."""
    n = QUICK_N if quick else N
    import d2l_transformer as d2t
    from d2l_transformer._runtime import environ, threads
    _, framework, dtype = key.split("_")
    if framework == "torch":
        environ.restore_user_environ()  # PyTorch's oneDNN reads the cap too: the user's
        import baselines
        reason = baselines.missing("torch")
        if reason:
            return float("nan"), {"skipped": reason}
        import torch
        torch.set_num_threads(threads.threads_for(threads.BIG_WORK) or torch.get_num_threads())
        a, b = (torch.rand(n, n, dtype=getattr(torch, dtype)) for _ in range(2))
        seconds = _best(lambda: a @ b, lambda out: None)
        return 2 * n ** 3 / seconds / 1e9, {"threads": torch.get_num_threads()}
    import mxnet as mx

    from d2l_transformer.training import precision
    chosen, _ = precision.settle(d2t.FULL.replace(precision=dtype), 4000, mx.cpu())
    if chosen.name != dtype:
        return float("nan"), {"skipped": chosen.why}
    used = threads.size_for(threads.BIG_WORK)  # every core, as the (h) rows
    a, b = (mx.nd.random.uniform(shape=(n, n)) for _ in range(2))
    if dtype == "bfloat16":
        a, b = (mx.nd.amp_cast(x, dtype=precision.BFLOAT16) for x in (a, b))
    seconds = _best(lambda: mx.nd.FullyConnected(a, b, num_hidden=n, no_bias=True),
                    lambda out: out.wait_to_read())
    return 2 * n ** 3 / seconds / 1e9, {"threads": used}
