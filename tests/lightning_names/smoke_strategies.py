"""Smoke uses of ``ptrain.lightning.strategies`` (trained on two processes in
tests/test_lightning_components.py)."""

from __future__ import annotations

import datetime

import torch

from lightning_names import refuses
from lightning_names._components import fit, trainer
from ptrain.lightning import strategies as s


def _ddp():
    run = trainer(strategy=s.DDPStrategy(find_unused_parameters=True, start_method="spawn",
                                         timeout=datetime.timedelta(minutes=2)), devices=2)
    options = run.config["plugins"]["ddp"]
    assert run.options["strategy"] == "ddp" and options["find_unused_parameters"] is True
    assert options["launcher"] == "spawn" and options["timeout"] == 120.0
    # Before fit the strategy already answers the world size the run will have, as Lightning's.
    assert isinstance(run.strategy, s.DDPStrategy) and run.strategy.world_size == 2
    refuses(lambda: s.DDPStrategy(ddp_comm_hook=lambda state, bucket: None), "ddp_comm_hook")
    refuses(lambda: s.DDPStrategy(static_graph=True), "static_graph")


def _deepspeed():
    run = trainer(strategy=s.DeepSpeedStrategy(stage=3, offload_optimizer=True,
                                               offload_parameters=True), devices=2)
    assert run.options["strategy"] == "zero3" and run.config["plugins"]["zero3"]["cpu_offload"]
    assert trainer(strategy="deepspeed_stage_1", devices=2).options["strategy"] == "zero1"
    refuses(lambda: s.DeepSpeedStrategy(config={"train_batch_size": 8}), "config",
            "DeepSpeed's own engine")
    refuses(lambda: s.DeepSpeedStrategy(stage=2, offload_optimizer=True), "offload_optimizer")


def _fsdp():
    run = trainer(strategy=s.FSDPStrategy(auto_wrap_policy={torch.nn.Linear}, cpu_offload=True,
                                          activation_checkpointing_policy={torch.nn.Linear}),
                  devices=2)
    options = run.config["plugins"]
    assert run.options["strategy"] == "fsdp" and options["fsdp"]["cpu_offload"] is True
    assert options["fsdp"]["wrap_classes"] == ["torch.nn.modules.linear.Linear"]
    assert options["activation-checkpointing"]["classes"] == ["torch.nn.modules.linear.Linear"]
    shard_grad_op = trainer(strategy=s.FSDPStrategy(sharding_strategy="SHARD_GRAD_OP"),
                            devices=2)
    assert shard_grad_op.options["strategy"] == "zero2"
    hybrid = trainer(strategy=s.FSDPStrategy(sharding_strategy="HYBRID_SHARD"), devices=2)
    assert hybrid.options["strategy"] == "fsdp"
    assert hybrid.config["plugins"]["fsdp"]["replicate"] == "nodes"  # one copy per node
    refuses(lambda: s.FSDPStrategy(sharding_strategy="NO_SHARD"), "sharding_strategy",
            "HYBRID_SHARD", "DDPStrategy")
    refuses(lambda: s.FSDPStrategy(device_mesh=(2, 4)), "device_mesh", "HYBRID_SHARD",
            "--fsdp-replicate")
    refuses(lambda: s.FSDPStrategy(auto_wrap_policy=lambda *a, **k: True), "auto_wrap_policy")


def _model_parallel():
    run = trainer(strategy=s.ModelParallelStrategy(), devices=2)
    options = run.config["plugins"]["model-parallel"]
    assert run.options["strategy"] == "model-parallel"
    # Lightning's "auto": data parallel over the nodes, tensor parallel within one
    assert (options["replicate"], options["shard"], options["tensor"]) == (1, "auto", "auto")
    assert options["mesh_names"] == "lightning"
    run = trainer(strategy=s.ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
                  devices=2)
    options = run.config["plugins"]["model-parallel"]
    assert (options["shard"], options["tensor"]) == (2, 1)
    refuses(lambda: s.ModelParallelStrategy(tensor_parallel_size=0), "tensor_parallel_size",
            "1 or more")
    refuses(lambda: s.ModelParallelStrategy(save_distributed_checkpoint=False),
            "save_distributed_checkpoint", "ptrain export")


def _parallel():
    assert issubclass(s.DDPStrategy, s.ParallelStrategy) and issubclass(s.FSDPStrategy,
                                                                        s.ParallelStrategy)
    refuses(lambda: s.DDPStrategy(parallel_devices=[torch.device("cpu")] * 2),
            "parallel_devices", "devices=")
    refuses(lambda: trainer(strategy=s.ParallelStrategy()), "Strategy API", "ptrain plugin")


def _single_device():
    run, module = fit(strategy=s.SingleDeviceStrategy("cpu"))
    assert run.options["strategy"] == "single-device" and run.global_step == 4
    assert run.strategy.root_device == torch.device("cpu") and run.strategy.is_global_zero
    assert run.strategy.lightning_module is module


def _strategy():
    class MyStrategy(s.Strategy):
        def reduce(self, tensor, *args, **kwargs):
            return tensor

    refuses(lambda: trainer(strategy=MyStrategy()), "MyStrategy", "Strategy API")
    run, _ = fit()
    strategy = run.strategy
    assert isinstance(strategy, s.Strategy) and strategy.world_size == 1
    strategy.barrier()
    assert strategy.broadcast({"a": 1}) == {"a": 1}
    assert strategy.reduce(torch.tensor(3.0)) == torch.tensor(3.0)
    assert strategy.all_gather(torch.ones(2)).shape == (2,)
    assert strategy.reduce_boolean_decision(False) is False


def _registry():
    names = s.StrategyRegistry.available_strategies()
    assert {"ddp", "ddp_spawn", "fsdp", "deepspeed_stage_2", "zero1", "single_device"} <= set(names)
    spawn = s.StrategyRegistry.get("ddp_spawn")
    assert isinstance(spawn, s.DDPStrategy) and spawn.start_method == "spawn"
    s.StrategyRegistry.register("ddp_long_timeout", s.DDPStrategy,
                                timeout=datetime.timedelta(hours=1))
    try:
        run = trainer(strategy="ddp_long_timeout", devices=2)
        assert run.config["plugins"]["ddp"]["timeout"] == 3600.0
    finally:
        s.StrategyRegistry.remove("ddp_long_timeout")


SMOKE = {
    "DDPStrategy": _ddp,
    "DeepSpeedStrategy": _deepspeed,
    "FSDPStrategy": _fsdp,
    "ModelParallelStrategy": _model_parallel,
    "ParallelStrategy": _parallel,
    "SingleDeviceStrategy": _single_device,
    "Strategy": _strategy,
    "StrategyRegistry": _registry,
}
