"""Every example of the README and of the documentation site (docs/) as written: each YAML
block parses and is a valid file of its kind, each ``shoal train`` command line parses into a
config (training is replaced by a stub: the budgets of the examples are the user's, not a
test's), and each block's other commands (eval, export, experiment, report, tune, list,
collect) run as written, at a tiny budget, on the run the block's train line before them
makes (trained for real, at a tiny budget). Lines that join a Ray cluster
(``--ray-address`` other than ``local``) are parsed, not run: there is no cluster here.
The docs' Python blocks run in tests/test_docs.py."""

import re
import shlex
from pathlib import Path

import pytest
import yaml

from shoal.cli import main
from shoal.cli.train import split_args, train_config

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TEXTS = {page: page.read_text() for page in PAGES}
BLOCKS = [b for text in TEXTS.values() for b in re.findall(r"```(\w+)\n(.*?)```", text, re.S)]
FILES = {
    name: body
    for text in TEXTS.values()
    for name, body in re.findall(r'```python title="([^"]+)"\n(.*?)```', text, re.S)
}
"""The files the docs write out in full (``my_envs.py``, ``mynets.py``), by name."""


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


NEEDS_A_RUN = ("--resume", "--config")
"""Lines that read a run or a file an earlier line of their block makes: run by
`test_each_blocks_commands_run_as_written`, on that run."""


def test_the_pages_have_examples():
    assert len(commands()) >= 60 and sum(kind == "yaml" for kind, _ in BLOCKS) >= 3


@pytest.mark.parametrize("kind, text", [b for b in BLOCKS if b[0] == "yaml"])
def test_each_yaml_block_is_a_valid_file_of_its_kind(kind, text, tmp_path):
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    if "search" in data:
        pytest.importorskip("optuna")
        from shoal.studies.tune import Tuner

        Tuner(data, tmp_path)  # the space parses and every value fits the base config
    elif "axes" in data or "seeds" in data:
        from shoal.studies.plan import plan

        assert plan(data, tmp_path).runs
    elif "algo" in data:
        from shoal.registry import read_tuned

        path = tmp_path / "example.yaml"
        path.write_text(text)
        read_tuned(path).build_config()


@pytest.mark.parametrize("line", commands())
def test_each_train_command_parses_into_a_config(line, tmp_path, monkeypatch):
    if any(marker in line for marker in NEEDS_A_RUN):
        covered = [lines for lines in block_scripts() if line in lines]
        assert covered, f"{line!r} reads a run no block test makes"
        return
    monkeypatch.chdir(tmp_path)  # the user's modules the examples name, as the README has them
    monkeypatch.syspath_prepend(str(tmp_path))
    write_readme_files(tmp_path)
    if line.endswith("--help"):
        try:
            assert main(shlex.split(line)[1:]) == 0
        except SystemExit as exit_:  # tyro's help exits
            assert exit_.code == 0
        return
    built = train_config(*split_args(shlex.split(line)[2:]))
    assert built is not None and (built[1].env.id or getattr(built[1], "dataset", "")), line


TINY = ["--run.total-steps", "256", "--run.eval-every-steps", "0", "--run.no-console",
        "--run.no-tensorboard"]  # fmt: skip
"""Appended to the train line whose run a later command of its block reads."""


def block_scripts() -> list[list[str]]:
    """The bash blocks with a command besides ``shoal train``, as lists of shoal lines."""
    scripts = []
    for kind, text in BLOCKS:
        if kind != "bash":
            continue
        lines = [line.split(" #")[0].strip() for line in text.replace("\\\n", " ").splitlines()]
        lines = [line for line in lines if line.startswith("shoal ")]
        if any(not line.startswith("shoal train") for line in lines):
            scripts.append(lines)
    return scripts


def write_readme_files(directory: Path) -> None:
    """The pages' YAML files (each names itself on its first line) and the user modules
    their examples import: ``mynets`` and ``my_envs`` as the docs write them (a whole
    Corridor where a page leaves its body out)."""
    from test_first_hour import CUSTOM_ENV

    (directory / "my_envs.py").write_text(CUSTOM_ENV)
    for kind, text in BLOCKS:
        first = text.splitlines()[0]
        if kind == "yaml" and first.startswith("# ") and first.endswith(".yaml"):
            (directory / first[2:]).write_text(text)
        if kind == "python" and first == "# mynets.py":
            (directory / "mynets.py").write_text(text)
    for name, text in FILES.items():
        (directory / name).write_text(text)


def tiny_files(directory: Path) -> None:
    """The experiment and the search at a tiny budget: 2,048 steps a run, 1 seed, 2 trials."""
    sweep = yaml.safe_load((directory / "lr-sweep.yaml").read_text())
    sweep.update(seeds=1, config={"run": {"total_steps": 2048, "target_return": None}})
    (directory / "lr-sweep.yaml").write_text(yaml.safe_dump(sweep))
    search = yaml.safe_load((directory / "search.yaml").read_text())
    search.update(trials=2, config={"run": {"total_steps": 2048, "eval_every_steps": 1024,
                                            "target_return": None}})  # fmt: skip
    (directory / "search.yaml").write_text(yaml.safe_dump(search))


def reads_a_run(argv: list[str]) -> bool:
    return argv[0] in ("eval", "export", "collect") or "--resume" in argv


def joins_a_cluster(argv: list[str]) -> bool:
    return any(
        a == "--ray-address" and argv[i + 1 : i + 2] != ["local"] for i, a in enumerate(argv)
    )


def with_run(argv: list[str], run: str) -> list[str]:
    """``argv`` with the README's placeholder run (``runs/...``, ``RUN``) replaced."""
    return [run if a == "RUN" or (a.startswith("runs/") and "experiments" not in a) else a
            for a in argv]  # fmt: skip


def scripts_and_marks() -> list:
    """Each block, two in the slow tier: the MuJoCo one (rendering a 1,000-step HalfCheetah
    episode headless (EGL) takes about a minute on 2 cores) and the one that makes a dataset
    by its recipe (a SAC run; tests/test_collect_cli.py runs a tiny recipe)."""
    slow = ("cheetah", "--recipe")
    return [
        pytest.param(lines, id=lines[-1][:40],
                     marks=[pytest.mark.slow] if any(s in x for x in lines for s in slow) else [])
        for lines in block_scripts()
    ]  # fmt: skip


@pytest.mark.extra("report", "tune", "export", "pettingzoo", "video")
@pytest.mark.parametrize("lines", scripts_and_marks())
def test_each_blocks_commands_run_as_written(lines, tmp_path, monkeypatch, capsys):
    if any("cheetah.mp4" in line for line in lines):
        pytest.importorskip("mujoco", reason="needs pip install 'shoal[mujoco]'")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    write_readme_files(tmp_path)
    tiny_files(tmp_path)
    argvs = [shlex.split(line)[1:] for line in lines]
    run = None
    for i, argv in enumerate(argvs):
        if argv[0] == "train" and "--help" in argv:
            continue  # test_each_train_command_parses_into_a_config runs the help lines
        if argv[0] == "train" and not reads_a_run(argv):
            needed = any(reads_a_run(later) for later in argvs[i + 1 :])
            if not needed:
                continue  # parsed by test_each_train_command_parses_into_a_config
            run = str(tmp_path / "runs" / f"r{i}")
            assert main([*argv, *TINY, "--run.run-dir", run]) == 0, capsys.readouterr().out
            continue
        if argv[0] == "train":  # a resume: parsed on the run, not trained for the budget
            assert train_config(*split_args(with_run(argv, run)[1:])) is not None, argv
            continue
        if joins_a_cluster(argv):
            continue  # parsed, where it is a train line; no cluster here to run it on
        code = main(with_run(argv, run) if reads_a_run(argv) else argv)
        assert code == 0, (argv, capsys.readouterr().out)
