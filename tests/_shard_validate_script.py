"""A 2-rank validation of a sharded checkpoint, for ``tests/plugins/strategies/test_sharding.py``.

    python tests/_shard_validate_script.py CHECKPOINT OUT.json [--strategy fsdp]

It validates :class:`ValidatedShardNet` (the resume runs' model) from the sharded folder
``CHECKPOINT`` and rank 0 writes the stage's metrics to ``OUT.json``: an evaluation restores the
weights alone, with no optimizer to restore."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ptrain  # noqa: E402
from _shard_models import ValidatedShardNet  # noqa: E402
from _shard_resume_script import MODEL_ARGS  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--strategy", default="fsdp")
    args = p.parse_args(argv)
    trainer = ptrain.Trainer(strategy=args.strategy, devices=2, accelerator="cpu", seed=0,
                             default_root_dir=str(Path(args.out).parent / "runs"),
                             callbacks=["no:progress-bar", "no:tensorboard"])
    metrics = trainer.validate(ValidatedShardNet(**MODEL_ARGS), ckpt_path=args.checkpoint)
    if trainer.is_global_zero:
        Path(args.out).write_text(json.dumps(metrics))


if __name__ == "__main__":
    main()
