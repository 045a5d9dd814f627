"""What a newcomer runs into in a first hour with ptrain, each named where it was silent or
confusing: a resume that trains nothing, a duration given as ``1h``, a folder of checkpoints
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
def test_a_duration_with_a_unit_names_both_forms_a_duration_takes(capsys, flag):
    """``--max-time 1h`` said "expected a number", though --help says seconds or DD:HH:MM:SS."""
    from ptrain.cli import main

    assert main(["fit", "--model", "tests.conftest:TinyRegressor", flag, "1h"]) == 2
    message = capsys.readouterr().err
    assert "expected seconds (a number, such as 3600) or DD:HH:MM:SS (00:01:00:00), got '1h'" \
        in message, message


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
