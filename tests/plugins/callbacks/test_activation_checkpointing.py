"""The ``activation-checkpointing`` callback and :mod:`ptrain.module_classes`, on real models.

Nothing of torch is replaced. Memory is measured exactly, not timed: a ``TorchDispatchMode``
(:class:`ptrain.testing.LiveStorages`) records every tensor storage an operator creates during a forward pass, and weak references to
the storages tell which ones the autograd graph still keeps alive when the forward returns. That
counts everything kept for backward, checkpointing's own kept block inputs included (a
``saved_tensors_hooks`` count would not see them: checkpointing installs its own hooks inside
the checkpointed blocks). The fsdp test is one real 2-rank gloo job.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

import ptrain
from ptrain import ConfigError
from ptrain.module_classes import (checkpoint_activations, is_checkpointed, modules_of_classes,
                                   qualified_name)
from ptrain.testing import LiveStorages
from ptrain_activation_checkpointing import ActivationCheckpointing
from tests._cli_util import assert_usage_error
from tests._shard_models import Block, RunProbe, ShardNet
from tests.conftest import TinyRegressor, run_cli

QUIET = ["no:progress-bar", "no:tensorboard"]
PLUGIN = "activation-checkpointing"


class Stack(nn.Module):
    """Embedding, ``depth`` transformer encoder layers (dropout on) in an ``nn.ModuleList``,
    mean pooling and a linear head: the shape ``auto`` is meant for."""

    def __init__(self, depth: int = 3, d_model: int = 32, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding(50, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, 4, 4 * d_model, dropout=dropout, batch_first=True)
            for _ in range(depth))
        self.head = nn.Linear(d_model, 5)

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h.mean(dim=1))


def tokens(batch: int = 16, seq: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50, (batch, seq), generator=g), torch.randint(0, 5, (batch,),
                                                                          generator=g)


def loss_and_grads(model: nn.Module, x, y, seed: int = 3):
    torch.manual_seed(seed)  # the same dropout masks in both models
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


# -- the numbers do not change -------------------------------------------------------------------


def test_same_loss_and_gradients_as_without_checkpointing():
    torch.manual_seed(0)
    plain = Stack()
    checkpointed = copy.deepcopy(plain)
    done = checkpoint_activations(checkpointed, ["auto"])
    assert [type(m) for m in done] == [nn.TransformerEncoderLayer] * 3
    assert all(is_checkpointed(m) for m in checkpointed.layers)
    # names and keys unchanged
    assert checkpointed.state_dict().keys() == plain.state_dict().keys()
    assert ([n for n, _ in checkpointed.named_parameters()]
            == [n for n, _ in plain.named_parameters()])
    x, y = tokens()
    loss, grads = loss_and_grads(plain, x, y)
    loss_ckpt, grads_ckpt = loss_and_grads(checkpointed, x, y)
    assert torch.equal(loss, loss_ckpt)
    assert grads.keys() == grads_ckpt.keys()
    worst = max((grads[n] - grads_ckpt[n]).abs().max().item() for n in grads)
    assert worst <= 1e-6, worst
    # dropout was on and the recomputation drew the same masks: another seed changes the loss
    assert not torch.equal(loss_and_grads(plain, x, y, seed=4)[0], loss)


def fit_shardnet(tmp_path, *callbacks, max_epochs: int = 1, **options):
    module = ShardNet(width=64, depth=3, lr=0.02, shuffle=False)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=max_epochs, seed=0,
                             default_root_dir=str(tmp_path / "runs"),
                             callbacks=[*QUIET, *callbacks], **options)
    trainer.fit(module)
    return trainer, module


def test_blocks_recompute_their_forward_in_backward_and_train_the_same(tmp_path):
    """ShardNet's Block counts its forward calls: 8 steps make 8 calls per block without the
    plugin, 16 with it (the recomputation in backward), and the weights end the same."""
    _, plain = fit_shardnet(tmp_path / "plain")
    plugin = ActivationCheckpointing(classes=["Block"])
    trainer, checkpointed = fit_shardnet(tmp_path / "ckpt", plugin)
    steps = 64 // 8
    assert trainer.global_step == steps
    assert [b.forward_calls for b in plain.blocks] == [steps] * 3
    assert [b.forward_calls for b in checkpointed.blocks] == [2 * steps] * 3
    assert plugin.checkpointed == ["module.blocks.0", "module.blocks.1", "module.blocks.2"]
    for name, value in plain.state_dict().items():
        difference = (checkpointed.state_dict()[name] - value).abs().max().item()
        assert difference <= 1e-6, (name, difference)
    # without gradients nothing is recomputed later, so nothing is checkpointed
    with torch.no_grad():
        checkpointed(torch.randn(2, 32))
    assert [b.forward_calls for b in checkpointed.blocks] == [2 * steps + 1] * 3


# -- what it saves --------------------------------------------------------------------------------


def held_after_forward(model: nn.Module, x, y) -> int:
    with LiveStorages() as storages:
        loss = nn.functional.cross_entropy(model(x), y)
    held = storages.live()
    loss.backward()  # the graph was complete and usable
    return held


def test_activation_memory_kept_for_backward_shrinks():
    """4 layers of d_model 64, batch 32 x sequence 32: without checkpointing each layer keeps its
    attention and feed-forward activations (several MiB); with it, a layer keeps only its input
    (32*32*64 float32 = 256 KiB) until backward recomputes the rest."""
    torch.manual_seed(0)
    plain = Stack(depth=4, d_model=64, dropout=0.0)
    checkpointed = copy.deepcopy(plain)
    checkpoint_activations(checkpointed, ["TransformerEncoderLayer"])
    x, y = tokens(batch=32, seq=32)
    plain_bytes = held_after_forward(plain, x, y)
    checkpointed_bytes = held_after_forward(checkpointed, x, y)
    layer_input = 32 * 32 * 64 * 4
    print(f"held after forward: {plain_bytes} plain, {checkpointed_bytes} checkpointed")
    assert plain_bytes > 4 * 8 * layer_input  # each plain layer keeps > 8 inputs' worth
    # the kept inputs are counted (the measure sees what checkpointing keeps)...
    assert checkpointed_bytes >= 4 * layer_input
    # ...and everything together is under a fifth of the plain model's
    assert checkpointed_bytes * 5 < plain_bytes


# -- checkpoints ----------------------------------------------------------------------------------


def test_checkpoint_loads_into_a_model_without_checkpointing(tmp_path):
    trainer, module = fit_shardnet(tmp_path, PLUGIN)  # classes: auto (Block)
    assert all(is_checkpointed(b) for b in module.blocks)
    [path] = (tmp_path / "runs").rglob("last.ckpt")
    state = torch.load(path, map_location="cpu", weights_only=True)["model"]
    fresh = ShardNet(width=64, depth=3)
    fresh.load_state_dict(state, strict=True)
    assert not any(is_checkpointed(b) for b in fresh.blocks)
    for name, value in module.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name
    # and the other way: a plain state dict into a checkpointed model
    checkpointed = ShardNet(width=64, depth=3, init_seed=1)
    checkpoint_activations(checkpointed, ["Block"])
    checkpointed.load_state_dict(fresh.state_dict(), strict=True)
    x = torch.randn(4, 32)
    assert torch.equal(checkpointed(x), fresh(x))
    # a deep copy (and a pickle) keeps working on its own weights
    twin = copy.deepcopy(checkpointed)
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    assert is_checkpointed(twin.blocks[0])
    assert torch.equal(twin.blocks[0](torch.ones(1, 64)), torch.ones(1, 64))
    assert not torch.equal(checkpointed.blocks[0](torch.ones(1, 64)), torch.ones(1, 64))


# -- choosing modules -----------------------------------------------------------------------------


def test_names_short_or_qualified_each_module_once_outermost_wins():
    model = ShardNet(width=8, depth=2)
    assert modules_of_classes(model, [qualified_name(Block)], "x") == list(model.blocks)
    assert modules_of_classes(model, ["Block", "Block"], "x") == list(model.blocks)
    # a block and the Linear inside it: only the block recomputes (it covers its Linear)
    done = checkpoint_activations(model, ["Linear", "Block"])
    assert done == [model.inp, *model.blocks, model.head]
    assert not any(is_checkpointed(b.linear) for b in model.blocks)
    assert checkpoint_activations(model, ["Block"]) == []  # twice: nothing more
    assert checkpoint_activations(model, []) == []


def test_a_name_matching_nothing_lists_the_model_classes():
    with pytest.raises(ConfigError, match=r"'Nope'.*Block, Dropout, Linear, ModuleList"):
        checkpoint_activations(ShardNet(width=8, depth=2), ["Block", "Nope"], option="--x")


def test_auto_without_repeated_blocks_is_a_config_error(tmp_path):
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path),
                             callbacks=[*QUIET, PLUGIN])
    with pytest.raises(ConfigError, match=r"repeats no module class.*Linear, Sequential"):
        trainer.fit(TinyRegressor())
    with pytest.raises(ConfigError, match="empty"):
        ActivationCheckpointing(classes=[])


# -- through the CLI ------------------------------------------------------------------------------


def test_cli_bad_class_is_a_usage_error_naming_the_model_classes(tmp_path):
    result = run_cli("fit", "--model", "tests._shard_models:ShardNet", "--accelerator", "cpu",
                     "--max-epochs", "1", "--default-root-dir", str(tmp_path), "--no-progress-bar",
                     "-p", "no:tensorboard", "-p", PLUGIN,
                     "--activation-checkpointing-classes", "Block,NoSuchBlock")
    assert_usage_error(result, "--activation-checkpointing-classes", "'NoSuchBlock'", "Block",
                       "Linear", "ModuleList", "ShardNet")
    assert not list(tmp_path.rglob("last.ckpt"))


def test_fsdp_has_no_option_of_its_own():
    """One way to checkpoint activations: fsdp's former option is gone."""
    result = run_cli("fit", "--model", "tests._shard_models:ShardNet", "--strategy", "fsdp",
                     "--fsdp-activation-checkpointing", "Block")
    assert_usage_error(result, "--fsdp-activation-checkpointing")


# -- with fsdp, 2 ranks ---------------------------------------------------------------------------


def data_parallel_reference(epochs: int = 1) -> dict[str, torch.Tensor]:
    """2-rank data parallelism computed in this process: each step is the mean loss over both
    ranks' batches (equal sizes), as DistributedSampler(seed 0) deals them."""
    module = ShardNet(lr=0.02)
    optimizer = module.configure_optimizers()
    samplers = [DistributedSampler(module.train_set, num_replicas=2, rank=r, shuffle=True, seed=0)
                for r in range(2)]
    for epoch in range(epochs):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        loaders = [list(DataLoader(module.train_set, batch_size=8, sampler=s)) for s in samplers]
        for (x0, y0), (x1, y1) in zip(*loaders):
            loss = nn.functional.mse_loss(module(torch.cat([x0, x1])), torch.cat([y0, y1]))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return module.state_dict()


@pytest.mark.slow
def test_composes_with_fsdp_on_two_ranks(tmp_path):
    """The callback checkpoints the blocks before fsdp shards them (its wrap_model works before
    the strategy's): the blocks recompute in backward on both ranks, and training gives 2-rank
    data parallelism's parameters."""
    module = ShardNet(lr=0.02)
    trainer = ptrain.Trainer(strategy="fsdp", devices=2, accelerator="cpu", max_epochs=1, seed=0,
                             default_root_dir=str(tmp_path / "runs"),
                             callbacks=[*QUIET, PLUGIN, RunProbe(str(tmp_path / "probe"))],
                             plugin_options={PLUGIN: {"classes": ["Block"]}})
    trainer.fit(module)
    steps = 64 // (8 * 2)
    assert trainer.global_step == steps
    for rank in range(2):
        probe = json.loads((tmp_path / "probe" / f"rank{rank}.json").read_text())
        assert probe["block_forward_calls"] == [2 * steps] * 4, probe
    reference = data_parallel_reference()
    params = module.state_dict()
    assert params.keys() == reference.keys()
    worst = max((params[k] - reference[k]).abs().max().item() for k in params)
    assert worst <= 1e-5, worst  # float32 reduction order only (see test_sharding.PARAM_ATOL)
