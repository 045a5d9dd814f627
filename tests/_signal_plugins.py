"""A callback for the CLI test of ``stop-signals`` (``-p tests._signal_plugins:SigtermAtStep3``):
it sends SIGTERM to its own process at the end of the third optimizer step."""

from __future__ import annotations

import os
import signal

import ptrain


class SigtermAtStep3:
    @ptrain.hookimpl(trylast=True)
    def on_train_batch_end(self, trainer):
        if trainer.global_step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
