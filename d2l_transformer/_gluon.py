"""The one place that knows Gluon blocks' private attributes (MXNet 1.9.1's ``gluon/block.py``
and ``gluon/nn/basic_layers.py``), for what Gluon has no public route to.

Public routes are used elsewhere: a Dense layer's units are ``dense.weight.shape[0]`` (known
before initialisation, ``(units, 0)`` while deferred), a block and its descendants are
``block.apply``'s walk. What is left, here:

* a block's named children (`children`), and a copy of a block with other children
  (`copy_block`: the fast path's graph copy, `training.fused`);
* a block's traced graph: whether it holds one (`has_graph`), its operators (`graph_json`),
  dropping it (`clear_graph`: `_graphs.invalidate`), hybridizing a block without its children
  (`hybridize_alone`: the translator's graphs, `inference.step`);
* one Parameter used by two blocks after both were built (`share_parameter`: weight tying,
  `build.tie_embeddings`);
* the settings of ``nn.Dropout`` and ``nn.LayerNorm``, which they keep privately
  (`dropout_rate`, `set_dropout_rate`, `layer_norm_eps`), for the fused kernels;
* a block's Parameters under the structural names ``save_parameters`` writes
  (`structural_params`), whether a Parameter's initialisation is still deferred (`deferred`),
  a Trainer's per-device updaters (`updaters`: the fused Adam's states), the rest of its
  set-up (`trainer_setup`, `trainer_index`, `set_optimizer_device`) and the broadcast of the
  initial weights its first ``allreduce_grads`` would make (`init_kvstore`).

A new MXNet that renames one of them breaks this module only (tests/test_packaging.py checks
that no other module reads them).
"""

import collections
from collections import OrderedDict


def children(block):
    """``{name: child}`` of `block`'s direct children in registration order (a copy of
    ``Block._children``)."""
    return OrderedDict(block._children)


def copy_block(block, cls, new_children):
    """A new block of class `cls` (`block`'s class or a subclass) with `block`'s state — its
    Parameter objects shared — and its children `new_children` (``{name: child}``, the names
    of `children(block)`): attributes that held a replaced child hold its replacement. The
    copy's graph is its own, traced at its first call; `block` is not changed. The copy holds
    no reference to `block` (its name scope, ``Block._scope``, is its own), so a cache keyed
    by `block` may keep the copy without keeping `block` alive."""
    copy = cls.__new__(cls)
    copy.__dict__.update(block.__dict__)  # a Block's whole state (``Block.__init__``'s fields)
    copy.__dict__["_scope"] = type(block._scope)(copy)  # ``_BlockScope(self)``: holds its block
    swap = {id(block._children[n]): c for n, c in new_children.items()}
    for name, value in block.__dict__.items():
        if id(value) in swap:  # self.attention = ... -> the replacement
            copy.__dict__[name] = swap[id(value)]
    copy.__dict__["_children"] = OrderedDict(new_children)
    clear_graph(copy)
    return copy


def share_parameter(block, name, param):
    """Make `param` (another block's Parameter) `block`'s parameter `name`, in place of its own:
    weight tying (Press & Wolf 2017), `build.tie_embeddings`. Gluon 1.x shares Parameters only
    at construction (``params=``, by name prefix), and ``Block.__setattr__`` refuses to
    override one, so three private places are changed: ``Block._reg_params[name]`` (what
    `forward` hands to ``hybrid_forward``, and what ``save_parameters`` names
    ``prefix.name``), the attribute itself, and the block's ``ParameterDict._params`` (what
    ``collect_params`` gathers: the block's own Parameter leaves it and `param` enters under
    its own name, so the Trainer and every count see `param` once). Before initialisation
    only; the shapes must agree where both are known (a deferred Dense weight is ``(units,
    0)``, ``(units, -1)`` in numpy mode). The block's traced graph, if any, is dropped.
    Returns `block`."""
    own = block._reg_params[name]
    if own is param:
        return block
    if len(own.shape) != len(param.shape) or any(
            a > 0 and b > 0 and a != b for a, b in zip(own.shape, param.shape)):
        raise ValueError(f"cannot share {param.name} {param.shape} as {own.name} {own.shape}")
    block._reg_params[name] = param
    object.__setattr__(block, name, param)  # Block.__setattr__ asserts against overriding
    entries = block.params._params  # ParameterDict: {full name: Parameter}
    del entries[own.name]
    entries[param.name] = param
    clear_graph(block)
    return block


def has_graph(block):
    """Whether `block` holds a traced graph (``HybridBlock._cached_op``; never a plain Block)."""
    return getattr(block, "_cached_op", None) is not None


def graph_json(block):
    """The JSON of `block`'s traced graph (the symbol in ``HybridBlock._cached_graph``), to
    check which operators it holds; None before its first traced call."""
    graph = getattr(block, "_cached_graph", ())
    return graph[1].tojson() if graph else None


def clear_graph(block):
    """Drop `block`'s traced graph (``HybridBlock._clear_cached_op``): its next call traces
    again. A plain Block has none."""
    clear = getattr(block, "_clear_cached_op", None)
    if clear is not None:
        clear()


def hybridize_alone(block, **flags):
    """``block.hybridize(**flags)`` without recursing into its children (Gluon's recurses,
    which would hybridize the caller's own model); the graph is traced through them all the
    same. Returns `block`."""
    kept, block._children = block._children, OrderedDict()
    try:
        block.hybridize(**flags)
    finally:
        block._children = kept
    return block


def dropout_rate(dropout):
    """The rate of an ``nn.Dropout`` (``Dropout._rate``, its constructor's `rate`)."""
    return dropout._rate


def set_dropout_rate(dropout, rate):
    """Set an ``nn.Dropout``'s rate (``Dropout._rate``); the graphs that contain it must be
    traced again (`_graphs.invalidate`)."""
    dropout._rate = rate


def layer_norm_eps(norm):
    """The epsilon of an ``nn.LayerNorm`` (``LayerNorm._epsilon``, its constructor's
    `epsilon`, what its forward passes to the operator)."""
    return norm._epsilon


def structural_params(block):
    """``{name: Parameter}`` under the names ``save_parameters`` writes and ``load_parameters``
    reads (``decoder.blks.0.ffn.ffn_1.weight``: ``Block._collect_params_with_prefix``)."""
    return block._collect_params_with_prefix()


def deferred(params):
    """Whether any of `params` still waits for its deferred initialisation (no data yet:
    ``Parameter._data`` is None until the first forward pass infers its shape)."""
    return any(p._data is None for p in params)


def updaters(trainer):
    """A Trainer's updaters, one per device (``Trainer._updaters``), which hold the
    optimizer's states."""
    return trainer._updaters


def dense_flatten(dense):
    """Whether an ``nn.Dense`` flattens its input to 2-d (``Dense._flatten``, its constructor's
    `flatten`)."""
    return dense._flatten


TrainerSetup = collections.namedtuple("TrainerSetup", ["devices", "kvstore", "update_on_kvstore",
                                                       "loss_scaler", "scale"])


def trainer_setup(trainer):
    """What a Trainer keeps privately that the fused Adam (`training.optim.ClipAdam`) must
    know: its number of devices (``_contexts``), its kvstore's name (``_kvstore_params``),
    whether it updates on the kvstore (``_update_on_kvstore``, None until decided), AMP's loss
    scaler (``_amp_loss_scaler``) and its gradient scale (``_scale``, `rescale_grad`)."""
    return TrainerSetup(len(trainer._contexts), trainer._kvstore_params.get("kvstore"),
                        trainer._update_on_kvstore, getattr(trainer, "_amp_loss_scaler", None),
                        trainer._scale)


def trainer_index(trainer, param):
    """The index a Trainer's updaters keep `param`'s optimizer state under (``_param2idx``)."""
    return trainer._param2idx[param.name]


def set_optimizer_device(optimizer, device_id):
    """Point an optimizer at the device whose states and update counts it keeps
    (``_set_current_context``: they are per device, as MXNet's updaters keep them)."""
    optimizer._set_current_context(device_id)


def optimizer_step(optimizer, indices, device_id):
    """An optimizer's bookkeeping for one update of the states `indices` on a device, as its
    ``update`` does (``_update_count``): ``(t, learning rates, weight decays)``, t the first
    index's update count (``_index_update_count``), the rates and decays ``_get_lrs`` and
    ``_get_wds``'s."""
    set_optimizer_device(optimizer, device_id)
    optimizer._update_count(indices)
    return (optimizer._index_update_count[indices[0]], optimizer._get_lrs(indices),
            optimizer._get_wds(indices))


def init_kvstore(trainer):
    """Create the Trainer's kvstore and broadcast the initial weights to every device and worker
    now, waiting once for those that went through a kvstore: what Gluon's Trainer does in its
    first ``allreduce_grads`` (``_init_kvstore``, ``_init_params``), for a data-parallel step to
    call before its first forward pass (`training.steps`).

    MXNet 1.9.1's Trainer broadcasts (kvstore ``init``, then an asynchronous ``pull``) after the
    first backward pass, right before the ``pushpull`` of the gradients on the same keys, and on
    a dist kvstore nothing orders the two: on the worker they write different arrays (weight,
    gradient), ps-lite's server queue (a heap on priority) does not keep their order, and with
    ``update_on_kvstore=False`` the pushpull's round stores the gradient SUM under the key. A
    pull served after it gives its worker that sum as the initial weight (docs/scale-out.md).
    Broadcast first, every gradient is computed, and pushed, after the weights it reads arrived.
    """
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    sent = list(trainer._params_to_init)
    if not sent:
        return
    trainer._init_params()  # keeps the parameters still deferred for a later call
    if trainer._kvstore is not None:  # once: every pull served before a gradient is pushed
        for param in sent:
            if param not in trainer._params_to_init:
                for data in param.list_data():
                    data.wait_to_read()
