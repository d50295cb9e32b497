"""Every example of the README as written: each YAML block parses and is a valid file of
its kind, and each ``shoal train`` command line parses into a config (training is replaced by
a stub: the budgets of the examples are the user's, not a test's)."""

import contextlib
import re
import shlex
from pathlib import Path

import pytest
import yaml

import shoal.api
from shoal.cli import main

README = (Path(__file__).parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, re.S)


def commands() -> list[str]:
    """The ``shoal train`` lines of the README's bash blocks, continuations joined and
    comments cut."""
    lines = []
    for kind, text in BLOCKS:
        if kind != "bash":
            continue
        for line in text.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("shoal train"):
                lines.append(line)
    return lines


NEEDS_USER_FILES = ("my_envs:", "my_wrappers:", "mynets:", "mypkg", "--resume", "--config")
"""Lines that name the user's own modules or runs: their flags are checked by the tests of
those features (custom envs, wrappers, encoders, resume, YAML configs), here only parsed
up to the name."""


def test_the_readme_has_examples():
    assert len(commands()) >= 15 and sum(kind == "yaml" for kind, _ in BLOCKS) >= 2


@pytest.mark.parametrize("kind, text", [b for b in BLOCKS if b[0] == "yaml"])
def test_each_yaml_block_is_a_valid_file_of_its_kind(kind, text, tmp_path):
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    if "search" in data:
        pytest.importorskip("optuna")
        from shoal.tune import Tuner

        Tuner(data, tmp_path)  # the space parses and every value fits the base config
    elif "axes" in data or "seeds" in data:
        from shoal.experiment import plan

        assert plan(data, tmp_path).runs
    elif "algo" in data:
        from shoal.registry import read_tuned

        path = tmp_path / "example.yaml"
        path.write_text(text)
        read_tuned(path).build_config()


@pytest.mark.parametrize("line", commands())
def test_each_train_command_parses_into_a_config(line, monkeypatch, capsys):
    if any(marker in line for marker in NEEDS_USER_FILES):
        pytest.skip("names the user's own files")
    if line.endswith("--help"):
        try:
            assert main(shlex.split(line)[1:]) == 0
        except SystemExit as exit_:  # tyro's help exits
            assert exit_.code == 0
        return
    built = []
    monkeypatch.setattr(shoal.api, "train", lambda config, resume=None: built.append(config))
    with contextlib.suppress(AttributeError, TypeError):  # the stub returns no result
        main(shlex.split(line)[1:])
    assert built, capsys.readouterr().out
