"""A GAN that learns to draw scikit-learn's 8x8 handwritten digits: two optimizers, one model.

The generator and the discriminator are two parts of one module, each with its own optimizer.
The module optimizes manually and trains one part at a time with ``toggle_model`` from the
``toggling`` plugin, which switches the other part's parameters off for the backward pass (and,
with ``sync_grad=False``, skips the gradient all-reduce under DDP)::

    ptrain fit --config examples/gan.toml
    ptrain fit --config examples/gan.toml --strategy ddp --devices 2

Each validation draws 360 digits from a fixed set of latent vectors and scores them against the
360 held-out real digits with two measures (both logged, and shown in the progress bar):

- ``val_fd``: the Fréchet distance between the real and the generated digits, as 64-pixel
  vectors (FID's formula, on pixels instead of Inception features; lower is better, 0 when the
  two sets have the same mean and covariance).
- ``val_digit_score``: the Inception Score's formula with a logistic-regression digit classifier
  fitted on the training digits: ``exp(E[KL(p(y|x) || p(y))])``, between 1 (every image looks
  alike, or like nothing) and 10 (every image a clear digit, all ten equally often). The real
  held-out digits score 7.05; an untrained generator's digits 1.01.

Figures measured with this configuration are in ``docs/callbacks.md``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

import ptrain
from ptrain.examples.digits import digits_datasets
from ptrain_toggling import toggle_model

PIXELS = 64


def frechet_distance(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """``|mu_r - mu_f|^2 + tr(S_r + S_f - 2 (S_r S_f)^(1/2))`` over the rows of two matrices."""
    real, fake = real.double(), fake.double()
    mu_r, mu_f = real.mean(0), fake.mean(0)
    cov_r, cov_f = torch.cov(real.T), torch.cov(fake.T)
    values, vectors = torch.linalg.eigh(cov_r)
    root_r = vectors @ torch.diag(values.clamp(min=0).sqrt()) @ vectors.T
    # tr((S_r S_f)^(1/2)) = tr((S_r^(1/2) S_f S_r^(1/2))^(1/2)), the latter symmetric
    cross = torch.linalg.eigvalsh(root_r @ cov_f @ root_r).clamp(min=0).sqrt().sum()
    return (mu_r - mu_f).square().sum() + cov_r.trace() + cov_f.trace() - 2 * cross


def digit_classifier(train_images: torch.Tensor, train_labels: torch.Tensor) -> nn.Linear:
    """A logistic-regression digit classifier (about 96% accurate on held-out digits)."""
    from sklearn.linear_model import LogisticRegression

    fitted = LogisticRegression(max_iter=2000).fit(train_images.numpy(), train_labels.numpy())
    layer = nn.Linear(PIXELS, 10)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(fitted.coef_))
        layer.bias.copy_(torch.from_numpy(fitted.intercept_))
    return layer.requires_grad_(False)


def digit_score(probabilities: torch.Tensor) -> torch.Tensor:
    """``exp(E_x[KL(p(y|x) || p(y))])`` for rows of class probabilities."""
    marginal = probabilities.mean(0, keepdim=True)
    kl = (probabilities * (probabilities.clamp_min(1e-12).log()
                           - marginal.clamp_min(1e-12).log())).sum(1)
    return kl.mean().exp()


class DigitsGAN(ptrain.TrainModule):
    automatic_optimization = False

    def __init__(self, latent: int = 32, hidden: int = 256, lr: float = 1e-3,
                 batch_size: int = 64):
        super().__init__()
        self.latent, self.lr, self.batch_size = latent, lr, batch_size
        self.generator = nn.Sequential(
            nn.Linear(latent, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, PIXELS), nn.Sigmoid(),
        )
        self.discriminator = nn.Sequential(
            nn.Linear(PIXELS, hidden), nn.LeakyReLU(0.2), nn.Dropout(0.2),
            nn.Linear(hidden, hidden), nn.LeakyReLU(0.2), nn.Dropout(0.2),
            nn.Linear(hidden, 1),
        )
        self.train_set, self.val_set = digits_datasets()
        # scoring only: neither trained nor saved with the weights
        self.classifier = [digit_classifier(*self.train_set.tensors)]
        self.register_buffer("val_latents", torch.randn(
            len(self.val_set), latent, generator=torch.Generator().manual_seed(0)),
            persistent=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)

    def training_step(self, batch, batch_idx):
        real, _ = batch
        opt_g, opt_d = self.optimizers()
        fake = self.generator(torch.randn(len(real), self.latent, device=real.device))
        ones = torch.ones(len(real), 1, device=real.device)
        zeros = torch.zeros_like(ones)

        with toggle_model(opt_d):  # the generator's parameters get no gradient here
            d_loss = (F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
                      + F.binary_cross_entropy_with_logits(
                          self.discriminator(fake.detach()), zeros))
            self.manual_backward(d_loss)
            opt_d.step()
            opt_d.zero_grad()

        with toggle_model(opt_g):  # nor the discriminator's here
            g_loss = F.binary_cross_entropy_with_logits(self.discriminator(fake), ones)
            self.manual_backward(g_loss)
            opt_g.step()
            opt_g.zero_grad()

        self.log("d_loss", d_loss.detach(), prog_bar=True)
        self.log("g_loss", g_loss.detach(), prog_bar=True)
        return g_loss.detach()

    def validation_step(self, batch, batch_idx):
        real, _ = batch
        fake = self.generator(self.val_latents[:len(real)])
        classifier = self.classifier[0].to(fake.device)
        self.log("val_fd", frechet_distance(real, fake), prog_bar=True)
        self.log("val_digit_score", digit_score(classifier(fake).softmax(1)), prog_bar=True)

    def configure_optimizers(self):
        betas = (0.5, 0.999)
        return [torch.optim.Adam(self.generator.parameters(), lr=self.lr, betas=betas),
                torch.optim.Adam(self.discriminator.parameters(), lr=self.lr, betas=betas)]

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True,
                          drop_last=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=len(self.val_set))
