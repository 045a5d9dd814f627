"""What a newcomer runs into in a first hour with ptrain, each named where it was silent or
confusing: a resume that trains nothing, a duration given as ``1h`` (now taken), a folder of checkpoints
given as one checkpoint, a flag's bad value blamed on ``Trainer(...)``, an init argument of the
wrong type, a config file's ``ckpt_path`` answered as a flag."""

from __future__ import annotations

import warnings

import pytest

from conftest import TinyRegressor


def test_resuming_a_checkpoint_already_at_max_epochs_says_nothing_is_trained(make_trainer):
    """``ptrain fit --ckpt-path last`` with the --max-epochs of the run it resumes (or less)
    printed "Training finished" in 0.0 s and trained nothing, without a word."""
    make_trainer(max_epochs=2).fit(TinyRegressor())
    with pytest.warns(UserWarning, match=r"has trained 2 epoch\(s\), 16 step\(s\), which "
                                         r"already reaches max_epochs=1, so nothing is "
                                         r"trained.*Raise max_epochs \(--max-epochs\)"):
        make_trainer(max_epochs=1).fit(TinyRegressor(), ckpt_path="last")
    with warnings.catch_warnings():  # a limit above what it has trained: it trains, unsaid
        warnings.simplefilter("error")
        trainer = make_trainer(max_epochs=3)
        trainer.fit(TinyRegressor(), ckpt_path="last")
    assert trainer.global_step == 24


@pytest.mark.parametrize("stage", ["test", "validate", "predict"])
def test_a_runs_checkpoints_folder_given_as_the_checkpoint_names_the_files_in_it(
        make_trainer, tmp_path, capsys, stage):
    """``ptrain test --ckpt-path runs/version_0/checkpoints/`` (the folder, not the file in it)
    was called "a sharded checkpoint folder without its meta.pt: its save was cut short",
    a damaged checkpoint, where nothing is damaged."""
    from ptrain.cli import main

    make_trainer(max_epochs=1).fit(TinyRegressor())
    folder = tmp_path / "runs" / "version_0" / "checkpoints"
    assert main([stage, "--ckpt-path", str(folder)]) == 2
    message = capsys.readouterr().err
    assert "sharded" not in message and "cut short" not in message, message
    assert f"is a folder, not a checkpoint file; checkpoints under it: {folder}/last.ckpt" \
        in message, message


@pytest.mark.parametrize("flag", ["--max-time", "--checkpoint-train-time-interval"])
def test_a_duration_takes_a_unit_and_a_bad_one_names_every_form(capsys, flag):
    """``--max-time 1h`` said "expected a number", where ``--tune-budget 1h`` worked: every
    duration takes the same forms (one parser), and a bad one names them all."""
    from ptrain.cli import main

    assert main(["fit", "--model", "tests.conftest:TinyRegressor", flag, "1.5h",
                 "--print-config"]) == 0
    assert "5400.0" in capsys.readouterr().out
    assert main(["fit", "--model", "tests.conftest:TinyRegressor", flag, "1 hour"]) == 2
    message = capsys.readouterr().err
    assert "expected seconds (3600), a number with s, m, h or d (90s, 10m, 1.5h, 2d) or " \
        "DD:HH:MM:SS (00:01:00:00), got '1 hour'" in message, message
    assert main(["fit", "--model", "tests.conftest:TinyRegressor", flag, "00:00:00:00"]) == 2
    assert "expected a duration above 0, got '00:00:00:00'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["--max-epochs", "one"], "invalid value for --max-epochs (config key 'max_epochs' in "
                              "[trainer]): expected an integer, got str 'one'."),
    (["--gradient-clip-algorithm", "nrom"], "valid choices: norm, value. Did you mean 'norm'?"),
])
def test_a_bad_flag_value_is_not_blamed_on_a_trainer_call(capsys, argv, said):
    """``ptrain fit --max-epochs one`` said "(Trainer(...))", a call the user never wrote; a
    flag's bad value is named as a plugin flag's is: the flag and its config key."""
    from ptrain.cli import main

    assert main(["fit", "--model", "tests.conftest:TinyRegressor", *argv]) == 2
    message = capsys.readouterr().err
    assert "Trainer(...)" not in message and said in message, message


@pytest.mark.parametrize("argv, said", [
    (["--model.batch_size", "abc"], "--model.batch_size (or batch_size in [model.init_args]) is "
                                    "str 'abc', but TinyRegressor's argument batch_size is "
                                    "annotated int."),
    (["--model.n", "64.0"], "is float 64.0, but TinyRegressor's argument n is annotated int."),
    (["--model.shuffle", "yes"], "is str 'yes', but TinyRegressor's argument shuffle is "
                                 "annotated bool."),
])
def test_an_init_argument_of_the_wrong_type_is_named_before_the_model_is_built(capsys, argv,
                                                                                said):
    """``--model.hidden abc`` for ``hidden: int`` failed inside torch ("empty(): argument 'size'
    must be tuple of ints"), where the user's flag was not named."""
    from ptrain.cli import main

    assert main(["fit", "--model", "tests.conftest:TinyRegressor", *argv]) == 2
    message = capsys.readouterr().err
    assert said in message and "Values are read as TOML" in message, message


def test_an_init_argument_the_annotation_admits_is_not_refused():
    from ptrain.cli import _check_init_types

    _check_init_types(TinyRegressor, {"lr": 1, "n": 8, "shuffle": True, "scheduler": None,
                                      "optimizer": 3}, "model")  # an int for a float, for str


@pytest.mark.parametrize("argv, said", [
    (["--model", "tests.conftest:TinyRegresor"], "has no attribute 'TinyRegresor'"),
    (["--model", "tests.conftest:TinyRegressor", "--model.l", "0.1"],
     "TinyRegressor has no init argument 'l'"),
    (["--model", "tests.conftest:TinyRegressor", "--model.n", "many"], "annotated int"),
    (["--model", "tests.conftest:TinyRegressor", "--data", "tests.conftest:TinyRegressor"],
     "is not a ptrain.DataModule subclass"),
])
def test_print_config_checks_the_model_it_prints(capsys, argv, said):
    """``ptrain fit --model model:MoonClasifier --print-config > run.toml`` printed the config
    and exited 0; the mistake came out only at the next step, ``ptrain fit --config
    run.toml``."""
    from ptrain.cli import main

    assert main(["fit", *argv, "--print-config"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and said in err, err


def test_print_config_of_a_good_model_still_prints_it(capsys):
    from ptrain.cli import main

    assert main(["fit", "--model", "tests.conftest:TinyRegressor", "--model.lr", "0.5",
                 "--print-config"]) == 0
    assert 'init_args = { lr = 0.5 }' in capsys.readouterr().out


@pytest.mark.parametrize("typed, meant", [("lats", "last"), ("bets", "best")])
def test_a_mistyped_ckpt_path_word_names_the_word(tmp_path, monkeypatch, capsys, typed, meant):
    """``--ckpt-path lats`` was taken for a path and said only "does not exist"."""
    from ptrain.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["test", "--ckpt-path", typed]) == 2
    message = capsys.readouterr().err
    assert f"checkpoint {typed!r} does not exist. Did you mean {meant!r}?" in message, message


def test_a_missing_checkpoint_file_gets_no_word_suggested(tmp_path, monkeypatch, capsys):
    from ptrain.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["test", "--ckpt-path", "last.ckpt"]) == 2
    assert "Did you mean" not in capsys.readouterr().err


def test_ckpt_path_last_from_a_config_file_with_no_run_yet_says_both_ways_out(
        tmp_path, capsys, monkeypatch):
    """docs/configuration.md's file had ``ckpt_path = "last"``: a first run stopped with "start
    without --ckpt-path", a flag the user never gave. It names the file's key too, and
    ``auto``, which the page's file now has."""
    from ptrain.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.toml").write_text('ckpt_path = "last"\n[model]\n'
                                       'class_path = "tests.conftest:TinyRegressor"\n')
    assert main(["fit", "--config", "run.toml", "--accelerator", "cpu"]) == 2
    message = capsys.readouterr().err
    assert "start without it (--ckpt-path, or ckpt_path in the --config file); `fit " \
        "--ckpt-path auto` resumes when there is one, else starts anew." in message, message


_DOCUMENTED_MODEL = '''
import ptrain


class Documented(ptrain.TrainModule):
    """A model whose arguments are documented Google style.

    Args:
        hidden (int): width of the hidden
            layer. Wider learns faster.
        name: the run's name, in 100% of its logs.
    """

    def __init__(self, name: str, hidden: int = 64, lr: float = 3e-3, tags=None):
        super().__init__()


class Documented2(ptrain.DataModule):
    """Data documented NumPy style.

    Parameters
    ----------
    n : int
        how many examples to make.
    """

    def __init__(self, n: int = 8):
        super().__init__()
'''


def _help_of(argv, tmp_path, monkeypatch, capsys) -> str:
    """``ptrain fit ARGV --help``, run where the module ``documented_help`` is importable, its
    runs of white space (where argparse wraps and indents) one space each."""
    from ptrain.cli import main

    (tmp_path / "documented_help.py").write_text(_DOCUMENTED_MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["fit", *argv, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_help_lists_the_model_init_arguments(tmp_path, monkeypatch, capsys):
    """``ptrain fit --model M:C --help`` listed the core's and the plugins' options but not
    the model's ``--model.KEY`` arguments: a newcomer had to read the class's source."""
    text = _help_of(["--model", "documented_help:Documented"], tmp_path, monkeypatch, capsys)
    for said in ["documented_help:Documented (model): the init arguments of Documented: "
                 "--model.KEY VALUE",
                 "--model.name NAME the run's name, in 100% of its logs (str, required)",
                 "--model.hidden HIDDEN width of the hidden layer (int, default: 64)",
                 "--model.lr LR (float, default: 0.003)",
                 "--model.tags TAGS (default: None)"]:
        assert said in text, text
    usage = text[:text.index("Train a ptrain.TrainModule")]
    assert " --model.name NAME [--model.hidden HIDDEN]" in usage, usage  # required: no [ ]


def test_help_lists_the_data_init_arguments_of_a_config_files_class(tmp_path, monkeypatch,
                                                                     capsys):
    (tmp_path / "run.toml").write_text('[data]\nclass_path = "documented_help:Documented2"\n')
    text = _help_of(["--config", "run.toml"], tmp_path, monkeypatch, capsys)
    assert "documented_help:Documented2 (data): the init arguments of Documented2" in text, text
    assert "--data.n N how many examples to make (int, default: 8)" in text, text


@pytest.mark.parametrize("model, said", [
    ("documented_help:Nope", "its init arguments are not listed: --model "
                             "'documented_help:Nope' could not be imported: AttributeError"),
    ("documented_help:Documented2", "its init arguments are not listed: --model "
                                    "'documented_help:Documented2' is not a ptrain.TrainModule "
                                    "subclass"),
])
def test_help_says_why_a_models_init_arguments_are_not_listed(tmp_path, monkeypatch, capsys,
                                                              model, said):
    text = _help_of(["--model", model], tmp_path, monkeypatch, capsys)
    assert f"{model} (model): {said}" in text, text


@pytest.mark.parametrize("doc", [
    """Google.

    Args:
        hidden (int): width of the
            hidden layer. More.
        lr: step size.

    Returns:
        out: not an argument.
    """,
    """NumPy.

    Parameters
    ----------
    hidden : int
        width of the
        hidden layer. More.
    lr
        step size.

    Returns
    -------
    out : int
        not an argument.
    """,
    """Sphinx.

    :param int hidden: width of the
        hidden layer. More.
    :param lr: step size.
    :returns: not an argument.
    """,
])
def test_init_argument_descriptions_are_read_in_each_docstring_style(doc):
    from ptrain.init_help import documented_arguments

    assert documented_arguments(doc) == {"hidden": "width of the hidden layer.",
                                         "lr": "step size."}
