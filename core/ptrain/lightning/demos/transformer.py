"""``lightning.pytorch.demos.transformer``: a small encoder-decoder language model and the
WikiText-2 training text it learns from (the word-level language model of PyTorch's examples).

The layers are created in Lightning's order with Lightning's shapes and defaults, so after the
same seed the weights are Lightning's and a fit gives the same result.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from ptrain.errors import ModelError
from ptrain.lightning.demos._download import DataUnavailableError, fetch
from ptrain.module import TrainModule as LightningModule

#: where the training text of WikiText-2 is downloaded from (PyTorch's examples repository)
WIKITEXT2_URL = ("https://raw.githubusercontent.com/pytorch/examples/main/word_language_model/"
                 "data/wikitext-2/train.txt")


class Transformer(nn.Module):
    """``nn.Transformer`` (batch first) between a word embedding with positional encoding and
    a linear layer over the vocabulary. ``forward(inputs, target, mask=None)`` takes two
    ``(batch, time)`` tensors of word indices and returns log-probabilities of shape
    ``(batch * time, vocab_size)``; the target side is masked causally unless ``mask`` is
    given. The default ``vocab_size`` is WikiText-2's."""

    def __init__(self, vocab_size: int = 33278, ninp: int = 200, nhead: int = 2,
                 nhid: int = 200, nlayers: int = 2, dropout: float = 0.2) -> None:
        super().__init__()
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.embedding = nn.Embedding(vocab_size, ninp)
        self.transformer = nn.Transformer(d_model=ninp, nhead=nhead, num_encoder_layers=nlayers,
                                          num_decoder_layers=nlayers, dim_feedforward=nhid,
                                          dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(ninp, vocab_size)
        self.ninp = ninp
        self.vocab_size = vocab_size
        _give_attention_reset_parameters(self)

    def generate_square_subsequent_mask(self, size: int) -> Tensor:
        """A ``(size, size)`` float mask: ``-inf`` above the diagonal (a position may not see
        later ones), ``0.0`` on and below it."""
        return torch.zeros(size, size).masked_fill(
            torch.ones(size, size, dtype=torch.bool).triu(diagonal=1), float("-inf"))

    def forward(self, inputs: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
        if mask is None:
            mask = self.generate_square_subsequent_mask(inputs.shape[1]).to(inputs.device)
        scale = math.sqrt(self.ninp)
        src = self.pos_encoder(self.embedding(inputs) * scale)
        tgt = self.pos_encoder(self.embedding(target) * scale)
        output = self.decoder(self.transformer(src, tgt, tgt_mask=mask))
        return F.log_softmax(output, dim=-1).view(-1, self.vocab_size)


def _give_attention_reset_parameters(model: nn.Module) -> None:
    # torch's MultiheadAttention initialises its own tensors in _reset_parameters only
    # (pytorch/pytorch#107909), and ptrain's meta-device initialisation (configure_model under
    # fsdp, Trainer.init_module) asks each module for reset_parameters(); the instances of this
    # model get it, torch's class is left as it is
    for module in model.modules():
        if isinstance(module, nn.MultiheadAttention) \
                and not hasattr(module, "reset_parameters"):
            module.reset_parameters = module._reset_parameters


class PositionalEncoding(nn.Module):
    """Adds a sinusoidal encoding of width ``dim`` to its ``(batch, time, dim)`` input, then
    dropout. The table (``max_len`` positions) is computed on the input's device at the first
    call and kept as ``pe`` (neither a parameter nor a buffer, so not in the state dict).

    As in Lightning, every position receives the encoding of position ``time`` (the sequence
    length), not its own: a model trained with Lightning's demo then loads and behaves the same
    here."""

    def __init__(self, dim: int, dropout: float = 0.1, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.dim = dim
        self.max_len = max_len
        self.pe: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.pe is None:
            self.pe = self._table(x.device)
        return self.dropout(x + self.pe[:, x.size(1)])

    def _table(self, device: torch.device) -> Tensor:
        """``(1, max_len, dim)``: sines in the even columns, cosines in the odd ones, of the
        position times ``10000 ** (-2i / dim)``."""
        position = torch.arange(self.max_len, dtype=torch.float, device=device)[:, None]
        frequency = torch.exp(torch.arange(0, self.dim, 2, device=device).float()
                              * (-math.log(10000.0) / self.dim))
        table = torch.zeros(self.max_len, self.dim, device=device)
        table[:, 0::2] = torch.sin(position * frequency)
        table[:, 1::2] = torch.cos(position * frequency)
        return table[None]


class Dictionary:
    """Words <-> indices, in the order the words were first added."""

    def __init__(self) -> None:
        self.word2idx: dict[str, int] = {}
        self.idx2word: list[str] = []

    def add_word(self, word: str) -> int:
        """The index of ``word``, added at the end if it is new."""
        index = self.word2idx.get(word)
        if index is None:
            index = self.word2idx[word] = len(self.idx2word)
            self.idx2word.append(word)
        return index

    def __len__(self) -> int:
        return len(self.idx2word)


def tokenize(path: Path) -> tuple[Tensor, Dictionary]:
    """The words of the UTF-8 text file at ``path`` as one ``int64`` tensor of indices, each
    line's whitespace-separated words followed by ``"<eos>"``, and the :class:`Dictionary` of
    those indices."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"tokenize({str(path)!r}): there is no such file; give the path of a "
                         f"UTF-8 text file.")
    dictionary = Dictionary()
    indices: list[int] = []
    with open(path, encoding="utf8") as text:
        for line in text:
            indices.extend(dictionary.add_word(word) for word in line.split())
            indices.append(dictionary.add_word("<eos>"))
    return torch.tensor(indices, dtype=torch.int64), dictionary


class WikiText2(Dataset):
    """The training text of WikiText-2 as ``(inputs, target)`` pairs of ``block_size`` word
    indices, the target shifted one word ahead. Item ``i`` starts at word ``i * block_size``.

    The text is the file ``data_dir / "wikitext-2.txt"``. When it is there it is used as it is;
    otherwise, with ``download=True``, it is downloaded from :data:`WIKITEXT2_URL` (the class
    attribute ``url``) first. A download that fails, or a missing file with ``download=False``,
    is a :class:`~ptrain.lightning.demos._download.DataUnavailableError` naming the address and
    where to put the file.
    """

    url = WIKITEXT2_URL

    def __init__(self, data_dir: Path = Path("./data"), block_size: int = 35,
                 download: bool = True) -> None:
        super().__init__()
        self.path = Path(data_dir) / "wikitext-2.txt"
        if download:
            self.download(self.path)
        elif not self.path.is_file():
            raise DataUnavailableError(
                f"WikiText2(download=False) finds no {self.path.resolve()}. Pass download=True "
                f"to fetch it from {self.url}, or put that file there yourself.")
        self.data, self.dictionary = tokenize(self.path)
        self.block_size = block_size

    @property
    def vocab_size(self) -> int:
        return len(self.dictionary)

    def __len__(self) -> int:
        return len(self.data) // self.block_size - 1

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        start = index * self.block_size
        return (self.data[start:start + self.block_size],
                self.data[start + 1:start + self.block_size + 1])

    @classmethod
    def download(cls, destination: Path) -> None:
        """Download the text to ``destination`` unless a file is there already."""
        destination = Path(destination)
        if not destination.exists():
            fetch(cls.url, destination)


class LightningTransformer(LightningModule):
    """:class:`Transformer` trained on :class:`WikiText2` (downloaded to ``./data`` in
    ``prepare_data``), one block per batch, by SGD at lr 0.1; ``training_step`` returns the
    negative log-likelihood of the next words and logs nothing."""

    def __init__(self, vocab_size: int = 33278) -> None:
        super().__init__()
        self.model = Transformer(vocab_size=vocab_size)

    def forward(self, inputs: Tensor, target: Tensor) -> Tensor:
        return self.model(inputs, target)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        inputs, target = batch
        return F.nll_loss(self(inputs, target), target.view(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=0.1)

    def prepare_data(self) -> None:
        WikiText2(download=True)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(WikiText2())
