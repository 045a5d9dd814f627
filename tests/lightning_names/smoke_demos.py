"""Smoke uses of ``ptrain.lightning.demos`` (tests/test_lightning_demos.py compares each with
Lightning's in detail)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import torch

import ptrain.lightning as pl
from ptrain.lightning import demos


def _trainer(root: str, **options) -> pl.Trainer:
    return pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", default_root_dir=root,
                      **options)


@contextlib.contextmanager
def _wikitext_here():
    """A temporary working folder holding ``data/wikitext-2.txt`` (22 lines of 33 words, 40
    different ones), where the language demos look for it."""
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        text = Path("data", "wikitext-2.txt")
        text.parent.mkdir()
        text.write_text("".join(" " + " ".join(f"w{(7 * i + j) % 40}" for j in range(33))
                                + " \n" for i in range(22)))
        yield folder


def _boring_model_fits():
    with tempfile.TemporaryDirectory() as root:
        model = demos.BoringModel()
        before = model.layer.weight.detach().clone()
        trainer = _trainer(root, max_steps=3, limit_val_batches=2)
        trainer.fit(model)
        assert trainer.global_step == 3 and not torch.equal(before, model.layer.weight)
        assert list(model.training_step(torch.ones(1, 32), 0)) == ["loss"]


def _data_module_parts():
    data = demos.BoringDataModule()
    data.setup("fit")
    assert len(data.train_dataloader()) == len(data.val_dataloader()) == 64
    assert torch.equal(next(iter(data.val_dataloader()))[0], data.random_full.data[64])


def _demo_model_fits():
    with tempfile.TemporaryDirectory() as root:
        model = demos.DemoModel(out_dim=4)
        before = model.l1.weight.detach().clone()
        trainer = _trainer(root, max_steps=2)
        trainer.fit(model, datamodule=demos.BoringDataModule())
        assert trainer.global_step == 2 and not torch.equal(before, model.l1.weight)


def _wikitext2_reads_its_file():
    with _wikitext_here() as folder:
        dataset = demos.WikiText2()
        assert dataset.path == Path("data") / "wikitext-2.txt"
        assert dataset.vocab_size == 41 and len(dataset) == 22 * 34 // 35 - 1
        inputs, target = dataset[1]
        assert inputs.shape == target.shape == (35,) and torch.equal(inputs[1:], target[:-1])
        assert Path(folder, "data").is_dir()


def _lstm_fits():
    with _wikitext_here() as root:
        model = demos.LightningLSTM(vocab_size=demos.WikiText2().vocab_size)
        trainer = _trainer(root, max_epochs=1, limit_train_batches=1)
        trainer.fit(model)
        assert trainer.global_step == 1 and "train_loss" in trainer.callback_metrics
        assert model.hidden is None  # dropped at the epoch's end


def _transformer_fits():
    with _wikitext_here() as root:
        model = demos.LightningTransformer(vocab_size=demos.WikiText2().vocab_size)
        trainer = _trainer(root, max_steps=1)
        trainer.fit(model)
        assert trainer.global_step == 1


def _sampler_interleaves():
    assert list(demos.SequenceSampler(range(10), batch_size=3)) == [[0, 3, 6], [1, 4, 7],
                                                                     [2, 5, 8]]


def _lstm_shapes():
    model = demos.SimpleLSTM(vocab_size=30, ninp=8, nhid=6, nlayers=2)
    out, (h, c) = model(torch.randint(0, 30, (3, 5)), model.init_hidden(3))
    assert out.shape == (15, 30) and h.shape == c.shape == (2, 3, 6)
    assert torch.allclose(out.exp().sum(1), torch.ones(15))


def _transformer_shapes():
    model = demos.Transformer(vocab_size=30, ninp=8, nhead=2, nhid=16, nlayers=1)
    tokens = torch.randint(0, 30, (2, 7))
    out = model(tokens, tokens)
    assert out.shape == (14, 30) and torch.allclose(out.exp().sum(1), torch.ones(14))


SMOKE = {
    "BoringModel": _boring_model_fits,
    "BoringDataModule": _data_module_parts,
    "DemoModel": _demo_model_fits,
    "LightningLSTM": _lstm_fits,
    "LightningTransformer": _transformer_fits,
    "SequenceSampler": _sampler_interleaves,
    "SimpleLSTM": _lstm_shapes,
    "Transformer": _transformer_shapes,
    "WikiText2": _wikitext2_reads_its_file,
}
