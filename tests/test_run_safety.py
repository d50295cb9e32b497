"""A run directory never runs code: names in a run's config are checked to be classes of the
kind their setting takes before anything is called, and modules a run records directories
for are imported only with --trust-code. Each crafted run below would leave a marker file if
anything in it ran."""

import json
import sys

import pytest

import shoal
from shoal.cli import main
from shoal.core.errors import ConfigError, ShoalError

SMALL = {"env.num_envs": 4, "num_steps": 16, "minibatch_size": 32, "num_epochs": 1,
         "run.eval_every_steps": 0, "run.console": False, "run.tensorboard": False}  # fmt: skip


@pytest.fixture
def run(tmp_path):
    """A small trained CartPole run, and a function that edits its checkpoint's config."""
    result = shoal.train("ppo", env="CartPole-v1", total_steps=64, run_dir=str(tmp_path / "run"),
                         **SMALL)  # fmt: skip
    [checkpoint] = (tmp_path / "run" / "checkpoints").glob("step_*")

    def edit(change):
        for path in (checkpoint / "config.json", tmp_path / "run" / "config.json"):
            config = json.loads(path.read_text())
            change(config)
            path.write_text(json.dumps(config))

    return result.run_dir, checkpoint, edit


def commands(run_dir):
    """Resume, eval and export of ``run_dir`` as the command line runs them."""
    return [["train", "--resume", str(run_dir), "--total-steps", "128"],
            ["eval", str(run_dir), "--episodes", "1"],
            ["export", str(run_dir), "--format", "torchscript"]]  # fmt: skip


@pytest.mark.parametrize(
    "setting, value, message",
    [
        (
            "callbacks",
            "subprocess:getoutput(cmd='touch {marker}')",
            "names a function, not a class",
        ),
        ("wrappers", "subprocess:getoutput(cmd='touch {marker}')", "names a function, not a class"),
        ("wrappers", "os:system", "names a builtin, not a class"),
        ("encoder", "subprocess:getoutput", "names a function, not a class"),
        ("encoder", "collections:OrderedDict", "is not an nn.Module subclass"),
    ],
)
def test_a_config_naming_a_function_is_refused_before_anything_runs(
    setting, value, message, run, tmp_path, capsys
):
    run_dir, _, edit = run
    marker = tmp_path / "ran"
    spec = value.format(marker=marker)

    def change(config):
        if setting == "callbacks":
            config["run"]["callbacks"] = [spec]
        elif setting == "wrappers":
            config["env"]["wrappers"] = [spec]
        else:
            config["model"]["encoder"] = spec

    edit(change)
    resumed = main(commands(run_dir)[0])  # the config's callbacks build before anything else
    assert resumed == 2 and message in capsys.readouterr().out
    if setting != "callbacks":  # eval builds the env and the networks
        assert main(commands(run_dir)[1]) == 2 and message in capsys.readouterr().out
    if setting == "encoder":  # export and load build the networks (not the env)
        assert main(commands(run_dir)[2]) == 2 and message in capsys.readouterr().out
        with pytest.raises((ConfigError, ShoalError), match=message):
            shoal.load(run_dir)
    assert not marker.exists()


EVIL = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")  # would run at import

from torch import nn


class Encoder(nn.Module):
    def __init__(self, obs_space, config):
        super().__init__()
        self.layer = nn.Linear(obs_space.shape[0], 8)
        self.out_dim = 8

    def forward(self, obs):
        return self.layer(obs)
"""


def test_a_module_shipped_in_the_run_is_imported_only_with_trust_code(run, tmp_path, capsys):
    """The run ships ``shipped_nets.py`` and records its directory in meta.json; resume,
    eval, export and load refuse to import it, naming the module and --trust-code; with
    --trust-code it imports (the marker shows it ran) and the run works."""
    run_dir, checkpoint, edit = run
    marker = tmp_path / "imported"
    code_dir = run_dir / "code"
    code_dir.mkdir()
    (code_dir / "shipped_nets.py").write_text(EVIL.format(marker=str(marker)))
    meta = json.loads((checkpoint / "meta.json").read_text())
    meta["import_dirs"] = [str(code_dir)]
    (checkpoint / "meta.json").write_text(json.dumps(meta))
    edit(lambda config: config["model"].update(encoder="shipped_nets:Encoder"))
    for args in commands(run_dir):
        assert main(args) == 2
        out = " ".join(capsys.readouterr().out.split())
        assert "module 'shipped_nets' is not importable here" in out and "--trust-code" in out
    with pytest.raises(ConfigError, match="trust_code=True"):
        shoal.load(run_dir)
    assert not marker.exists() and "shipped_nets" not in sys.modules
    # The user trusts it: the module imports from the recorded directory. (Its weights do not
    # fit the checkpoint's, so loading then fails on the weights, after the import.)
    with pytest.raises(ShoalError):
        shoal.load(run_dir, trust_code=True)
    assert marker.read_text() == "imported"
