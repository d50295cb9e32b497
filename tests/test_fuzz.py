"""Bad input, fuzzed (Hypothesis): random and malformed config overrides, YAML files,
command-line values, experiment files and search spaces thrown at the loaders. Each one
either works or is refused with a ShoalError (ConfigError among them) that names what is
wrong; never another exception, and never a run directory left behind."""

import contextlib
import math
import os
import string

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import shoal
import shoal.api
from shoal.cli import main
from shoal.config import to_dict
from shoal.core.errors import ConfigError, ShoalError

# The same 60 examples every run (derandomized from each test's name), so a red run is the
# code's and a rerun shows it again; `make test-fuzz` (SHOAL_FUZZ=explore) draws new ones,
# ten times as many, to look for what the fixed set misses.
EXPLORE = os.environ.get("SHOAL_FUZZ") == "explore"
EXAMPLES = settings(max_examples=600 if EXPLORE else 60, derandomize=not EXPLORE, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip


def fields(config) -> list[str]:
    """Every config field of ``config`` by its dotted name."""

    def flat(data, prefix=""):
        for key, value in data.items():
            if isinstance(value, dict) and value and key not in ("kwargs", "opponents"):
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield prefix + key

    return list(flat(to_dict(config)))


PPO_FIELDS = fields(shoal.build_config("ppo"))
DQN_FIELDS = fields(shoal.build_config("dqn"))

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)  # fmt: skip
values = st.one_of(scalars, st.lists(scalars, max_size=3),
                   st.dictionaries(st.text(max_size=5), scalars, max_size=2))  # fmt: skip


def refused_by_name(exc: Exception, key: str) -> bool:
    """Whether a refusal names the field it is about (its last part, or its block)."""
    text = str(exc).lower().replace("-", "_")
    parts = key.lower().split(".")
    return any(part in text for part in parts)


@EXAMPLES
@given(algo=st.sampled_from(["ppo", "dqn"]), data=st.data())
def test_random_overrides_build_or_are_refused_by_name(algo, data):
    names = PPO_FIELDS if algo == "ppo" else DQN_FIELDS
    chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    overrides = {key: data.draw(values) for key in chosen}
    try:
        shoal.build_config(algo, **overrides)
    except ConfigError as exc:
        assert any(refused_by_name(exc, key) for key in chosen), (overrides, str(exc))


yaml_text = st.one_of(
    st.text(alphabet=string.printable, max_size=200),
    st.builds(lambda algo, body: f"algo: {algo}\nconfig:\n{body}",
              st.sampled_from(["ppo", "dqn", "pp0", "[1, 2]", ""]),
              st.text(alphabet=string.printable, max_size=120)),
    st.builds(lambda d: yaml.safe_dump(d), st.dictionaries(
        st.sampled_from(["algo", "config", "description", "expected", "callbacks", "junk"]),
        values, max_size=4)),
)  # fmt: skip


@EXAMPLES
@given(text=yaml_text)
@example(text="algo: PPO\nconfig:\n ?")  # a null field name (found by this test)
@example(text="algo: PPO\nconfig: A")  # a config that is not a mapping
@example(text="algo: PPO\nconfig: 1")
def test_random_yaml_configs_load_or_are_refused(text, tmp_path):
    from shoal.registry import read_tuned

    path = tmp_path / "config.yaml"
    path.write_text(text)
    with contextlib.suppress(ShoalError):
        read_tuned(path).build_config()


@EXAMPLES
@given(key=st.sampled_from(PPO_FIELDS), value=st.text(alphabet=string.printable, max_size=20))
def test_random_command_line_values_parse_or_exit_with_a_message(key, value, tmp_path):
    built = []
    original = shoal.api.train
    shoal.api.train = lambda config, resume=None, **_: built.append(config)
    try:
        flag = "--" + key.replace("_", "-")
        code = main(["train", "ppo", flag, value, "--run.run-dir", str(tmp_path / "run")])
    except SystemExit as exit_:  # tyro refuses a value it cannot parse, with its message
        code = exit_.code
    except (AttributeError, TypeError):  # the stub returns no result to print: it parsed
        code = 0
    finally:
        shoal.api.train = original
    assert code in (0, 2)
    assert not (tmp_path / "run").exists()


experiment_specs = st.fixed_dictionaries(
    {"name": st.text(alphabet=string.ascii_letters, min_size=1, max_size=8)},
    optional={
        "base": st.sampled_from(["ppo-cartpole", "no-such-example", 3]),
        "algo": st.sampled_from(["ppo", "dqn", "nope", None]),
        "config": st.one_of(st.dictionaries(st.sampled_from(["run", "optim", "junk"]),
                                            st.dictionaries(st.sampled_from(["lr", "seed",
                                            "total_steps"]), scalars, max_size=2),
                                            max_size=2), scalars),
        "axes": st.one_of(st.dictionaries(st.sampled_from(PPO_FIELDS), st.lists(values,
                          max_size=3), max_size=2), scalars),
        "seeds": st.one_of(st.integers(-2, 4), scalars),
        "seed": scalars,
    },
)  # fmt: skip


@EXAMPLES
@given(spec=experiment_specs)
def test_random_experiment_files_plan_or_are_refused(spec, tmp_path):
    from shoal.studies.plan import plan

    with contextlib.suppress(ShoalError):
        plan(spec, tmp_path / "exp")
    assert not (tmp_path / "exp").exists()  # planning creates nothing


distributions = st.one_of(
    st.builds(lambda kind, a, b: f"{kind}({a}, {b})",
              st.sampled_from(["uniform", "loguniform", "int", "logint", "normal", "choice"]),
              st.one_of(st.integers(-5, 5), st.floats(-1e3, 1e3)),
              st.one_of(st.integers(-5, 5), st.floats(-1e3, 1e3))),
    st.text(alphabet=string.printable, max_size=25), scalars,
)  # fmt: skip


@EXAMPLES
@given(search=st.dictionaries(st.sampled_from([*PPO_FIELDS[:20], "optim.lr", "num_epochs",
                                               "no.such"]), distributions, max_size=3))  # fmt: skip
def test_random_search_spaces_parse_or_are_refused(search, tmp_path):
    pytest.importorskip("optuna")
    from shoal.studies.tune import Tuner

    with contextlib.suppress(ShoalError):
        Tuner({"name": "fuzz", "base": "ppo-cartpole", "search": search}, tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_the_fuzzed_fields_cover_every_block():
    assert {key.split(".")[0] for key in PPO_FIELDS} >= {"run", "env", "optim", "model"}
    assert not math.isnan(len(PPO_FIELDS))
