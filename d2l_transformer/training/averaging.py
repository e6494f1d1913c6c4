"""Parameter averaging in memory (Vaswani et al. 2017, 6.1, averaged the last 5 or 20
checkpoints): what `validation.LastParameters` averages and `contrib.averaging` writes."""


def average_arrays(params, names=None):
    """{name: mean NDArray} of the dicts ``{name: NDArray}`` in `params` (summed in float64,
    returned in each parameter's dtype); ``names``: how to name each dict in an error."""
    params = list(params)
    if not params:
        raise ValueError("no checkpoints to average")
    names = names or [f"checkpoint {i}" for i in range(len(params))]
    keys = set(params[0])
    for name, p in zip(names, params):
        if set(p) != keys:
            raise ValueError(f"{name} has different parameters from {names[0]}")
    return {k: (sum(p[k].astype("float64") for p in params) / len(params)).astype(params[0][k].dtype)
            for k in sorted(keys)}
