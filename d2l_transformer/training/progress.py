"""The training run's progress bar on stderr (`tqdm`)."""

import sys
import time

from tqdm import tqdm


class ProgressBar:
    """One `tqdm` bar on stderr for the whole run: epoch, batches, loss (book units) and target
    tokens/s of the current epoch. It is a ``train_s2s_ch8`` ``on_batch`` callback, so the
    loss it shows is the one the loop reads every ``report_every`` batches (and at each
    epoch's end): the bar itself never reads the device."""

    def __init__(self, num_epochs, num_batches, start_epoch=1, file=None):
        file = file or sys.stderr
        tty = hasattr(file, "isatty") and file.isatty()
        self.num_epochs, self.num_batches, self.start_epoch = num_epochs, num_batches, start_epoch
        self.bar = tqdm(total=num_epochs * num_batches, initial=(start_epoch - 1) * num_batches,
                        unit="batch", file=file, mininterval=0.1 if tty else 30, dynamic_ncols=tty)
        self.epoch, self.tic, self.file = None, time.time(), file

    def __call__(self, epoch, done, sums):
        if epoch != self.epoch:
            self.epoch, self.tic = epoch, time.time()
            self.bar.set_description(f"epoch {epoch}/{self.num_epochs}", refresh=False)
        self.bar.update((epoch - 1) * self.num_batches + done - self.bar.n)
        if sums is not None:
            loss_sum, num_tokens = sums
            speed = num_tokens / max(time.time() - self.tic, 1e-9)
            self.bar.set_postfix_str(f"loss {loss_sum / max(num_tokens, 1):.4f}, "
                                     f"{speed:.0f} tokens/s", refresh=False)

    def write(self, line):
        """A line above the bar (validation results)."""
        self.bar.write(line, file=self.file)

    def close(self):
        self.bar.close()
