"""A small GAN written as a Lightning user writes one: manual optimization with two optimizers,
toggle_optimizer, log_dict, a training_step without batch_idx and the module's own
on_train_epoch_end. Run as ``python gan.py OUT_DIR [precision] [devices]``."""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl


class GAN(pl.LightningModule):
    def __init__(self, latent: int = 4, lr: float = 0.01):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(latent, 16), nn.ReLU(), nn.Linear(16, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
        self.epochs_ended = 0

    def training_step(self, batch):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        ones = torch.ones(real.shape[0], 1, device=self.device)
        zeros = torch.zeros(real.shape[0], 1, device=self.device)
        z = torch.randn(real.shape[0], self.hparams.latent, device=self.device)
        bce = nn.functional.binary_cross_entropy_with_logits

        self.toggle_optimizer(opt_g)
        fake = self.generator(z)
        g_loss = bce(self.discriminator(fake), ones)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)

        self.toggle_optimizer(opt_d)
        d_loss = (bce(self.discriminator(real), ones)
                  + bce(self.discriminator(fake.detach()), zeros)) / 2
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True, on_epoch=True)

    def on_train_epoch_end(self):
        self.epochs_ended += 1
        self.log("epochs_ended", float(self.epochs_ended))

    def configure_optimizers(self):
        lr = self.hparams.lr
        return ([torch.optim.Adam(self.generator.parameters(), lr=lr),
                 torch.optim.Adam(self.discriminator.parameters(), lr=lr)], [])

    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        real = torch.randn(256, 2, generator=g) * torch.tensor([1.0, 0.3]) + 2
        return DataLoader(TensorDataset(real), batch_size=32, shuffle=True)


def main(out: str, precision: str = "32-true", devices: int = 1) -> None:
    pl.seed_everything(0)
    model = GAN()
    # manual optimization steps one network at a time: DDP must look for unused parameters
    strategy = "ddp_find_unused_parameters_true" if devices > 1 else "auto"
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", devices=devices, precision=precision,
                         strategy=strategy,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model)
    if trainer.is_global_zero:
        result = {
            "callback_metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
            "global_step": trainer.global_step,
            "epochs_ended": model.epochs_ended if devices == 1 else None,
            "weights": [float(p.detach().double().sum()) for p in model.parameters()],
        }
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:3], *[int(d) for d in sys.argv[3:4]])
