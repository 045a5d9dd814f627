"""A config file written by hand, with a newcomer's slips: a key under the wrong table (TOML
puts a line appended at the end of a file into the file's last table). Each is a usage error
(exit 2) that names the key, the table it landed in, and where it belongs. Run in process:
each is refused before a model is built."""

from __future__ import annotations

import pytest

from ptrain.cli import main

MODEL = '[model]\nclass_path = "tests.conftest:TinyRegressor"\n'


def refused(tmp_path, monkeypatch, capsys, text: str, *argv: str) -> str:
    (tmp_path / "run.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", "run.toml", *argv]) == 2
    message = capsys.readouterr().err
    assert message.startswith("ptrain: error:") and "Traceback" not in message, message
    assert not (tmp_path / "runs").exists()
    return message


def test_a_trainer_option_appended_to_a_printed_config_is_said_to_belong_in_trainer(
        tmp_path, monkeypatch, capsys):
    """``--print-config > run.toml``, then ``echo 'max_epochs = 10' >> run.toml``: the key lands
    in the file's last table, ``[plugins.stop-signals]``, and was refused as an unknown option
    of stop-signals, a plugin the user never wrote about."""
    text = MODEL + '[plugins.stop-signals]\nrequeue = false\nmax_epochs = 10\n'
    message = refused(tmp_path, monkeypatch, capsys, text)
    assert "'max_epochs' in [plugins.stop-signals] of 'run.toml' is an option of [trainer]" \
        in message, message
    assert "Move it under [trainer]." in message


@pytest.mark.parametrize("text, needles", [
    (MODEL + "max_steps = 3\n",
     ["'max_steps' in [model] of", "an option of [trainer]", "Move it under [trainer]."]),
    ("max_epochs = 1\n" + MODEL,
     ["'max_epochs' in", "above every table header", "Move it under [trainer]."]),
    (MODEL + "hidden = 8\n",
     ["unknown key(s) ['hidden'] in [model]", "init_args = { hidden = ... }",
      "[model.init_args]"]),
])
def test_a_key_under_the_wrong_table_says_where_it_belongs(tmp_path, monkeypatch, capsys,
                                                           text, needles):
    message = refused(tmp_path, monkeypatch, capsys, text)
    for needle in needles:
        assert needle in message, message


def test_a_misspelt_model_key_is_still_named_by_its_closest(tmp_path, monkeypatch, capsys):
    message = refused(tmp_path, monkeypatch, capsys, '[model]\nclass_pth = "x:Y"\n')
    assert "Did you mean 'class_path'?" in message and "init_args = {" not in message


@pytest.mark.parametrize("text, said", [
    ('[plugins.checkpoint]\nmode = "maxx"\n',
     "invalid value 'maxx' for 'mode' in [plugins.checkpoint] of 'run.toml'; valid choices: "
     "min, max. Did you mean 'max'?"),
    ('[plugins.checkpoint]\nevery_n_epochs = "two"\n',
     "invalid value for 'every_n_epochs' in [plugins.checkpoint] of 'run.toml': "),
    ('[plugins.checkpoint]\nmod = "max"\n',
     "unknown option 'mod' in [plugins.checkpoint] of 'run.toml'; valid keys: "),
    ('[trainer]\nmax_epochs = "one"\n',
     "invalid value for 'max_epochs' in [trainer] of 'run.toml': expected an integer, got str "
     "'one'."),
    ('[trainer]\nmax_epoch = 3\n',
     "unknown option 'max_epoch' in [trainer] of 'run.toml'; valid keys: "),
])
def test_a_bad_option_in_the_file_is_named_by_the_file_and_its_key(tmp_path, monkeypatch,
                                                                   capsys, text, said):
    """A plugin option's bad value in the config file was reported as the flag's ("invalid
    value 'maxx' for --checkpoint-mode ..."), a flag the user never gave; a [trainer] one as
    the flag's too, the file added in parentheses. Each names the file, the table and the key,
    and no flag."""
    message = refused(tmp_path, monkeypatch, capsys, MODEL + text)
    assert said in message and " --" not in message, message


@pytest.mark.parametrize("text, argv, said", [
    ('[plugins.checkpoint]\nmode = "max"\n', ["--checkpoint-mode", "maxx"],
     "invalid value 'maxx' for --checkpoint-mode (config key 'mode' in [plugins.checkpoint]); "
     "valid choices: min, max."),
    ('[trainer]\nmax_epochs = 2\n', ["--max-epochs", "one"],
     "invalid value for --max-epochs (config key 'max_epochs' in [trainer]): expected an "
     "integer, got str 'one'."),
])
def test_a_bad_flag_over_a_config_file_is_named_by_the_flag(tmp_path, monkeypatch, capsys,
                                                            text, argv, said):
    message = refused(tmp_path, monkeypatch, capsys, MODEL + text, *argv)
    assert said in message and "run.toml" not in message, message
