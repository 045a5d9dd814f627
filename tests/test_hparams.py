"""``save_hyperparameters()``/``hparams`` and ``load_from_checkpoint``: what is recorded, what is
refused, and that a checkpoint rebuilds the module without its arguments."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools

import numpy as np
import pytest
import torch
from torch import nn

import ptrain
from conftest import TinyRegressor


class Saved(TinyRegressor):
    def __init__(self, lr: float = 0.1, hidden: int = 4, name: str = "x", *, tags=("a",),
                 **extra):
        super().__init__(lr=lr)
        self.save_hyperparameters()


class Child(Saved):
    def __init__(self, width: int = 3, lr: float = 0.05):
        super().__init__(lr=lr, hidden=width)
        self.width = width


def test_every_init_argument_is_recorded_with_its_value():
    module = Saved(0.2, name="y", colour="red")
    assert dict(module.hparams) == {"lr": 0.2, "hidden": 4, "name": "y", "tags": ("a",),
                                    "colour": "red"}
    assert module.hparams.lr == 0.2  # attribute access, like Lightning's AttributeDict


def test_the_outermost_init_decides_and_its_own_arguments_count():
    module = Child(width=7)
    # Saved's save_hyperparameters ran inside Child's __init__: Child's arguments are the ones
    # a rebuild needs, Saved's fill in what Child does not name
    assert module.hparams["width"] == 7 and module.hparams["lr"] == 0.05
    assert module.hparams["hidden"] == 7


def test_names_dict_and_ignore():
    class Named(TinyRegressor):
        def __init__(self, lr: float = 0.1, hidden: int = 4):
            super().__init__(lr=lr)
            self.save_hyperparameters("hidden")

    class FromDict(TinyRegressor):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters({"depth": 2})

    class Ignoring(TinyRegressor):
        def __init__(self, lr: float = 0.1, hidden: int = 4):
            super().__init__(lr=lr)
            self.save_hyperparameters(ignore="lr")

    assert dict(Named().hparams) == {"hidden": 4}
    assert dict(FromDict().hparams) == {"depth": 2}
    assert dict(Ignoring().hparams) == {"hidden": 4}


class WithBackbone(TinyRegressor):
    def __init__(self, backbone: nn.Module, lr: float = 0.1):
        super().__init__(lr=lr)
        self.save_hyperparameters()


def test_a_module_argument_stays_in_hparams_but_not_in_checkpoints(tmp_path):
    backbone = nn.Linear(1, 1)
    with pytest.warns(UserWarning, match="keeps 'backbone'.*not in checkpoints.*"
                                         "ignore=\\['backbone'\\]"):
        module = WithBackbone(backbone)
    assert dict(module.hparams) == {"backbone": backbone, "lr": 0.1}  # as in Lightning
    path = tmp_path / "m.ckpt"
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar"])
    trainer.fit(module)
    trainer.save_checkpoint(path)
    assert torch.load(path, weights_only=True)["hyper_parameters"] == {"lr": 0.1}
    # loading it needs the backbone again, and says so (torch's TypeError named no reason)
    with pytest.raises(TypeError, match="the checkpoint holds no value for its required init "
                                        "argument backbone.*WithBackbone.load_from_checkpoint"
                                        "\(path, backbone=...\)"):
        WithBackbone.load_from_checkpoint(str(path))
    rebuilt = WithBackbone.load_from_checkpoint(str(path), backbone=nn.Linear(1, 1))
    assert rebuilt.hparams.lr == 0.1


def test_a_later_call_adds_to_the_first_and_its_ignore_list_removes():
    class Base(TinyRegressor):
        def __init__(self, a=1, b=2, lr=0.1):
            super().__init__(lr=lr)
            self.save_hyperparameters(ignore="a")

    class Sub(Base):
        def __init__(self, c=3, **kwargs):
            super().__init__(**kwargs)
            self.save_hyperparameters(ignore="lr")

    # Base recorded b and lr (its defaults); Sub adds c and takes lr out, as Lightning does
    assert dict(Sub(b=5).hparams) == {"b": 5, "c": 3}
    assert dict(Sub(b=5).hparams_initial) == {"b": 5, "c": 3}


@dataclasses.dataclass
class Schedule:
    warmup: int = 3
    decay: float = 0.5


class WithObjects(TinyRegressor):
    """Init arguments as Hydra and LightningCLI programs pass them: a class, a partial of one
    (Hydra's ``_partial_: true``), a dataclass, and one object no checkpoint can hold."""

    def __init__(self, optimizer=functools.partial(torch.optim.SGD, lr=0.3, momentum=0.5),
                 activation=nn.Tanh, schedule=Schedule(), opener=lambda path: path,
                 lr: float = 0.1):
        super().__init__(lr=lr)
        self.save_hyperparameters(logger=False)


def test_classes_partials_and_dataclasses_travel_in_checkpoints_other_objects_are_said(tmp_path):
    with pytest.warns(UserWarning, match="keeps 'opener'.*checkpoints can't hold it.*"
                                         "load_from_checkpoint\\(path, opener=...\\)"):
        module = WithObjects()
    assert module.hparams.activation is nn.Tanh and callable(module.hparams.opener)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard"], seed=0)
    trainer.fit(module)
    saved = torch.load(trainer.last_checkpoint_path, weights_only=True)["hyper_parameters"]
    assert set(saved) == {"optimizer", "activation", "schedule", "lr"}
    # logger=False: nothing for the loggers (nor hparams.toml), but the checkpoint has them
    assert not (trainer.log_dir / "hparams.toml").exists()
    rebuilt = WithObjects.load_from_checkpoint(str(trainer.last_checkpoint_path),
                                               opener=str.upper)
    assert rebuilt.hparams.activation is nn.Tanh and rebuilt.hparams.schedule == Schedule()
    assert rebuilt.hparams.opener is str.upper
    optimizer = rebuilt.hparams.optimizer(rebuilt.parameters())
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.defaults["lr"] == 0.3 and optimizer.defaults["momentum"] == 0.5


class Normalizer:
    """An object a program's checkpoints may hold once it allows the class (pytorch-forecasting's
    GroupNormalizer as its models' output_transformer)."""

    def __init__(self, center: float = 0.0):
        self.center = center

    def __eq__(self, other):
        return isinstance(other, Normalizer) and other.center == self.center


class WithAllowedObject(TinyRegressor):
    def __init__(self, normalizer=None, lr: float = 0.1):
        super().__init__(lr=lr)
        self.save_hyperparameters()


def test_an_object_of_a_class_the_program_allowed_travels_in_checkpoints(tmp_path, recwarn):
    # it was left out (and had to be passed again) although the loader would build it
    with torch.serialization.safe_globals([Normalizer]):
        module = WithAllowedObject(Normalizer(2.5))
        assert not [w for w in recwarn.list if "save_hyperparameters" in str(w.message)]
        trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1,
                                 default_root_dir=str(tmp_path),
                                 callbacks=["no:progress-bar", "no:tensorboard"])
        trainer.fit(module)
        rebuilt = WithAllowedObject.load_from_checkpoint(str(trainer.last_checkpoint_path))
    assert rebuilt.hparams.normalizer == Normalizer(2.5)
    with pytest.warns(UserWarning, match="keeps 'normalizer'.*add_safe_globals"):
        WithAllowedObject(Normalizer(1.0))  # not allowed here: said, and left out


class Activation(str, enum.Enum):  # a StrEnum, also on Python 3.10
    RELU = "relu"
    TANH = "tanh"


class WithSubclassedValues(TinyRegressor):
    """Values of subclasses of str and float, as chemprop and numpy give them: a ``StrEnum``
    option, in a list and in a dict added to ``hparams`` after ``save_hyperparameters``, and a
    numpy ``float64``."""

    def __init__(self, activation=Activation.TANH, lr=np.float64(0.25)):
        super().__init__(lr=float(lr))
        self.save_hyperparameters()
        self.hparams["block"] = {"activation": Activation.RELU, "choices": list(Activation)}


def test_enum_members_and_numpy_floats_travel_in_checkpoints(tmp_path):
    module = WithSubclassedValues()
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard"], seed=0)
    trainer.fit(module)  # the first save checks that the checkpoint loads again
    saved = torch.load(trainer.last_checkpoint_path, weights_only=True)["hyper_parameters"]
    assert type(saved["lr"]) is float and saved["lr"] == 0.25
    rebuilt = WithSubclassedValues.load_from_checkpoint(str(trainer.last_checkpoint_path))
    assert rebuilt.hparams.activation is Activation.TANH
    assert rebuilt.hparams.block == {"activation": Activation.RELU,
                                     "choices": [Activation.RELU, Activation.TANH]}


class Permission(enum.Flag):
    READ = 1
    WRITE = 2


def test_a_combination_of_flags_has_no_saved_form():
    from ptrain.hyperparameters import Unsaveable, saved_form

    assert saved_form(Permission.READ) == {
        "__ptrain_reference__": f"{__name__}:Permission.READ"}
    with pytest.raises(Unsaveable):
        saved_form(Permission.READ | Permission.WRITE)


def test_loggers_receive_every_value_as_text_where_it_is_not_plain():
    from ptrain.hyperparameters import logged_hyperparameters

    logged = logged_hyperparameters({"cls": nn.Tanh, "n": 3, "nested": {"a": [1, 2]},
                                     "opt": functools.partial(torch.optim.SGD, lr=0.1)})
    assert logged == {"cls": "torch.nn.modules.activation.Tanh", "n": 3,
                      "nested": {"a": [1, 2]},
                      "opt": "partial(torch.optim.sgd.SGD, lr=0.1)"}


def test_one_namespace_or_dict_gives_its_entries_and_hparams_initial_keeps_them():
    class FromNamespace(TinyRegressor):
        def __init__(self, args):
            super().__init__()
            self.save_hyperparameters(args)

    module = FromNamespace(argparse.Namespace(lr=0.2, layers=3))
    assert dict(module.hparams) == {"lr": 0.2, "layers": 3}
    module.hparams.lr = 0.5
    assert module.hparams_initial.lr == 0.2


def test_hparams_initial_keeps_nested_values_as_recorded_as_lightnings():
    # PyTorch Tabular changes its nested configs after recording them
    import importlib

    def run(name):
        pl = importlib.import_module(name)

        class Nested(pl.LightningModule):
            def __init__(self, head: dict):
                super().__init__()
                self.save_hyperparameters()

        module = Nested({"dims": [4, 2], "act": "relu"})
        module.hparams.head["dims"].append(1)
        module.hparams.head["act"] = "tanh"
        return dict(module.hparams_initial), dict(module.hparams)

    lightning, ours = (run(name) for name in ("lightning.pytorch", "ptrain.lightning"))
    assert ours == lightning
    assert ours[0] == {"head": {"dims": [4, 2], "act": "relu"}}


def test_unknown_names_and_calls_outside_init_are_errors():
    class Typo(TinyRegressor):
        def __init__(self, lr: float = 0.1):
            super().__init__(lr=lr)
            self.save_hyperparameters("lrr")

    with pytest.raises(ptrain.ModelError, match="'lrr'.*init arguments: lr"):
        Typo()
    module = TinyRegressor()
    with pytest.raises(ptrain.ModelError, match="inside __init__"):
        module.save_hyperparameters()
    assert dict(module.hparams) == {}


def test_checkpoint_carries_the_hyperparameters_and_rebuilds_the_module(tmp_path):
    module = Saved(lr=0.05, hidden=6)
    trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=str(tmp_path),
                             callbacks=["no:progress-bar", "no:tensorboard"], seed=0)
    trainer.fit(module)
    path = trainer.last_checkpoint_path
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["hyper_parameters"]["hidden"] == 6
    assert checkpoint["module_class"] == f"{Saved.__module__}:{Saved.__qualname__}"
    rebuilt = Saved.load_from_checkpoint(str(path))
    assert rebuilt.hparams["lr"] == 0.05 and not rebuilt.training
    for (name, a), (_, b) in zip(module.state_dict().items(), rebuilt.state_dict().items()):
        assert torch.equal(a, b), name
    assert Saved.load_from_checkpoint(str(path), hidden=9).hparams["hidden"] == 9


def test_a_run_without_hyperparameters_writes_no_hparams_toml(tmp_path):
    """hparams.toml is written when there are hyperparameters to log (the documented contract:
    Lightning's empty hparams.yaml has no counterpart), and its absence reads as none."""
    from ptrain.hyperparameters import read_hyperparameters_file

    runs = {}
    for name, module in (("none", TinyRegressor()), ("saved", Saved(hidden=6))):
        trainer = ptrain.Trainer(accelerator="cpu", max_epochs=1, seed=0,
                                 default_root_dir=str(tmp_path / name),
                                 callbacks=["no:progress-bar", "no:tensorboard"])
        trainer.fit(module)
        runs[name] = trainer.log_dir
        assert trainer.last_checkpoint_path.is_file()  # the run folder holds its checkpoint
    assert not (runs["none"] / "hparams.toml").exists()
    saved = read_hyperparameters_file(runs["saved"] / "hparams.toml")
    assert saved.keys() == Saved().hparams.keys() and saved["hidden"] == 6
