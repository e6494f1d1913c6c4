"""Training (9.3.7): the loss, the optimiser, the step (imperative, graph, data-parallel) and
the one loop that runs it; `training.run.train_model` is a whole run (data, model, checkpoints,
the chapter's translations), imported on its own as the command line and the scripts do."""

from .loop import set_seed, train_s2s_ch8
from .loss import MaskedSoftmaxCELoss
from .optim import ClipAdam, WarmupInverseSqrt, config_trainer, grad_clipping, make_trainer
from .steps import TrainGraph
