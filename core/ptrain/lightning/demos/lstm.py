"""``lightning.pytorch.demos.lstm``: an LSTM language model on WikiText-2, trained with the
hidden state carried from one batch to the next (truncated backpropagation through time).

The layers are created and initialised in Lightning's order, so after the same seed the
weights are Lightning's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Sampler

from ptrain.lightning.demos.transformer import WikiText2
from ptrain.module import TrainModule as LightningModule


class SimpleLSTM(nn.Module):
    """Embedding, dropout, an ``nlayers``-deep LSTM (batch first), dropout and a linear layer
    over the vocabulary. The embedding and the output weights start uniform in [-0.1, 0.1], the
    output bias at zero. ``forward(input, hidden)`` returns the log-probabilities, shape
    ``(batch * time, vocab_size)``, and the new ``(h, c)``."""

    def __init__(self, vocab_size: int = 33278, ninp: int = 512, nhid: int = 512,
                 nlayers: int = 4, dropout: float = 0.2):
        super().__init__()
        self.vocab_size = vocab_size
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(nhid, vocab_size)
        self.nlayers = nlayers
        self.nhid = nhid
        self.init_weights()

    def init_weights(self) -> None:
        """Re-draw the embedding and the output layer (the order of draws is Lightning's)."""
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input: Tensor, hidden: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        output, hidden = self.rnn(self.drop(self.encoder(input)), hidden)
        logits = self.decoder(self.drop(output)).view(-1, self.vocab_size)
        return F.log_softmax(logits, dim=1), hidden

    def init_hidden(self, batch_size: int) -> tuple[Tensor, Tensor]:
        """Zero ``(h, c)`` for ``batch_size`` sequences, on the device and in the dtype of the
        model's weights."""
        like = next(self.parameters())
        shape = (self.nlayers, batch_size, self.nhid)
        return like.new_zeros(shape), like.new_zeros(shape)


class SequenceSampler(Sampler[list[int]]):
    """Batches of ``batch_size`` indices for a hidden state carried between batches: the data
    set is cut into ``batch_size`` consecutive runs of ``len(dataset) // batch_size`` items
    (the last few items left out), and batch ``i`` holds item ``i`` of each run, so row ``r``
    of a batch continues row ``r`` of the batch before."""

    def __init__(self, dataset: Sized, batch_size: int) -> None:
        super().__init__()
        self.dataset = dataset
        self.batch_size = batch_size
        self.chunk_size = len(self.dataset) // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        used = self.chunk_size * self.batch_size
        for i in range(self.chunk_size):
            yield list(range(i, used, self.chunk_size))

    def __len__(self) -> int:
        return self.chunk_size


class LightningLSTM(LightningModule):
    """:class:`SimpleLSTM` trained on :class:`WikiText2` (downloaded to ``./data`` in
    ``prepare_data``) in batches of 20 rows from :class:`SequenceSampler`, by SGD at lr 20.
    The hidden state is kept (detached) from one batch to the next and dropped at each
    epoch's end; ``training_step`` logs ``train_loss`` to the progress bar and returns it."""

    def __init__(self, vocab_size: int = 33278):
        super().__init__()
        self.model = SimpleLSTM(vocab_size=vocab_size)
        self.hidden: tuple[Tensor, Tensor] | None = None

    def on_train_epoch_end(self) -> None:
        self.hidden = None

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        input, target = batch
        if self.hidden is None:
            self.hidden = self.model.init_hidden(input.size(0))
        output, self.hidden = self.model(input, tuple(h.detach() for h in self.hidden))
        loss = F.nll_loss(output, target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def prepare_data(self) -> None:
        WikiText2(download=True)

    def train_dataloader(self) -> DataLoader:
        dataset = WikiText2()
        return DataLoader(dataset, batch_sampler=SequenceSampler(dataset, batch_size=20))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=20.0)
