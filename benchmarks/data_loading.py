"""Steps per second with and without the dataloading callback's apply / preload."""
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import ptrain
from ptrain.data import available_cpus


class Transformed(Dataset):
    """Each fetch runs a small CPU transform (about 0.25 ms per item, single-threaded)."""
    def __init__(self, n=2048):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        v = self.x[i]
        for _ in range(40):
            v = torch.tanh(v * 1.1 + 0.01)
        return v, self.y[i]


class OnDisk(Dataset):
    """One .pt file per item (3x32x32 float32 and a label), read at every fetch."""
    def __init__(self, folder):
        self.paths = sorted(Path(folder).glob("*.pt"))
    def __len__(self):
        return len(self.paths)
    def __getitem__(self, i):
        return torch.load(self.paths[i], weights_only=True)


class Classifier(ptrain.TrainModule):
    def __init__(self, dataset, features, hidden=0, **loader):
        super().__init__()
        torch.manual_seed(0)
        self.dataset, self.loader = dataset, loader
        layers = [nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                  nn.Linear(hidden, 10)] if hidden else [nn.Linear(features, 10)]
        self.net = nn.Sequential(nn.Flatten(), *layers)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
    def train_dataloader(self):
        return DataLoader(self.dataset, batch_size=64, shuffle=True, **self.loader)


class StepRate:
    """Training steps per second of epoch wall time (worker start-up included), and the
    training process's own CPU time per step."""
    def __init__(self):
        self.steps, self.seconds, self.cpu = 0, 0.0, 0.0
    @ptrain.hookimpl
    def on_epoch_start(self):
        self.start, self.cpu_start = time.perf_counter(), time.process_time()
    @ptrain.hookimpl
    def on_epoch_end(self, trainer):
        self.seconds += time.perf_counter() - self.start
        self.cpu += time.process_time() - self.cpu_start
        self.steps += trainer.num_training_batches


def run(dataset, features, options, epochs, hidden):
    """options: the dataloading callback's options, or None: callback off; a key "loader"
    gives DataLoader arguments instead (with the callback off)."""
    rate = StepRate()
    callbacks = ["no:progress-bar", "no:tensorboard", "no:checkpoint", rate]
    loader = (options or {}).get("loader", {})
    if options is None or loader:
        callbacks.append("no:dataloading")
        options = None
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=epochs, seed=0, callbacks=callbacks,
                             default_root_dir=tempfile.mkdtemp(),
                             plugin_options={"dataloading": options} if options else None)
    start = time.perf_counter()
    trainer.fit(Classifier(dataset, features, hidden, **loader))
    total = time.perf_counter() - start
    report = trainer.plugins["dataloading"].report["train"] if options else {}
    return rate.steps / rate.seconds, rate.cpu / rate.steps * 1e3, total, report


def compare(arms, dataset, features, epochs, hidden=0, repeats=5):
    """Runs each (label, options) arm, alternating (the machine's load varies)."""
    arms = (("off (-p no:dataloading)", None), *arms)
    results = {name: [] for name, _ in arms}
    for _ in range(repeats):
        for name, opts in arms:
            results[name].append(run(dataset, features, opts, epochs, hidden))
    for name, rows in results.items():
        rates = [r for r, _, _, _ in rows]
        preload = [rep["preload_seconds"] for *_, rep in rows if "preload_seconds" in rep]
        extra = f"; preload {statistics.median(preload):.2f} s" if preload else ""
        print(f"  {name:24s} median {statistics.median(rates):6.1f} steps/s "
              f"(runs: {', '.join(f'{r:.1f}' for r in rates)}); training process CPU "
              f"{statistics.median(c for _, c, _, _ in rows):.1f} ms/step; whole fit "
              f"{statistics.median(t for _, _, t, _ in rows):.2f} s{extra}", flush=True)


if __name__ == "__main__":
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"cores {available_cpus()}, load average {load}", flush=True)
    workers = [("1 worker, persistent", {"loader": {"num_workers": 1,
                                                    "persistent_workers": True}}),
               ("apply, cpus=3: 2 workers", {"apply": True, "cpus": 3})]
    print("workers (Transformed: 2048 items, batch 64, 3 epochs), linear model:")
    compare(workers, Transformed(), 64, epochs=3)
    print("workers, the same with an MLP 64-1024-1024-10 (a step about as long as a fetch):")
    compare(workers, Transformed(), 64, epochs=3, hidden=1024)
    with tempfile.TemporaryDirectory() as folder:
        g = torch.Generator().manual_seed(0)
        for i in range(4096):
            torch.save((torch.randn(3, 32, 32, generator=g), torch.tensor(i % 10)),
                       f"{folder}/{i:05d}.pt")
        print("preload (OnDisk: 4096 files of 12 KiB, batch 64, 3 epochs, page cache warm):")
        compare([("--dataloading-preload", {"preload": True})], OnDisk(folder), 3 * 32 * 32,
                epochs=3)
