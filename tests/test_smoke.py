"""The example trains on real data and the Python API and the CLI agree on the basics."""

import math

from ptrain.examples.digits import DigitsClassifier


def test_example_reaches_stated_accuracy(make_trainer):
    trainer = make_trainer(max_epochs=10, seed=0)
    trainer.fit(DigitsClassifier())
    accuracy = float(trainer.callback_metrics["val_acc"])
    assert accuracy >= 0.95, accuracy
    assert trainer.global_step == 10 * math.ceil(1438 / 32)
    assert trainer.last_checkpoint_path.is_file()
