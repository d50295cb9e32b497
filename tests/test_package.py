"""The release package: an sdist and a wheel built from it (``python -m build``) hold shoal's
data files, install into a fresh virtual environment, and train there, away from the source
tree; the version comes from one place."""

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import shoal

ROOT = Path(__file__).resolve().parents[1]

needs_build = pytest.mark.skipif(
    importlib.util.find_spec("build") is None,
    reason="building the package needs the build frontend: pip install 'shoal[dev]'",
)
one_build = pytest.mark.xdist_group("package")
"""The tests of the built package run in one pytest-xdist worker: the module's fixture builds
once, and never beside another build (the sdist is assembled in a directory of the source
tree, which two builds at once would share)."""


def test_the_version_is_written_once():
    pyproject = (ROOT / "pyproject.toml").read_text()
    pyproject = pyproject.split("[project]", 1)[1].split("\n[", 1)[0]  # its [project] table
    assert not re.search(r"^version\s*=", pyproject, re.M)  # (shoal/__init__.py holds it)
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M)
    assert re.fullmatch(r"\d+\.\d+\.\d+", shoal.__version__)
    out = subprocess.run(
        [sys.executable, "-m", "shoal.cli", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == f"shoal {shoal.__version__}"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@needs_build
@one_build
def test_the_wheel_holds_the_package_and_its_data(built):
    (wheel,) = built.glob(f"shoal-{shoal.__version__}-*.whl")
    assert len(list(built.glob(f"shoal-{shoal.__version__}.tar.gz"))) == 1
    names = set(zipfile.ZipFile(wheel).namelist())
    tuned = {f"shoal/tuned/{p.name}" for p in (ROOT / "shoal" / "tuned").glob("*.yaml")}
    sumo = {f"shoal/envs/intersection/sumo/{p.name}"
            for p in (ROOT / "shoal" / "envs" / "intersection" / "sumo").glob("*.xml")}  # fmt: skip
    assert tuned and sumo and tuned | sumo <= names
    assert "shoal/py.typed" in names
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "shoal").rglob("*.py")}
    assert sources <= names, sorted(sources - names)[:5]
    assert not any(n.startswith(("tests/", "benchmarks/", "docs/")) for n in names)


@needs_build
@one_build
def test_the_wheel_installs_and_trains_away_from_the_source(built, tmp_path):
    """A fresh virtual environment with the wheel installed; its dependencies come from this
    environment's site-packages (a path, so that this checkout's editable install of shoal
    is not seen), and it runs from a directory outside the source tree."""
    (wheel,) = built.glob("shoal-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--quiet", "--disable-pip-version-check", str(wheel)],
        check=True,
    )  # fmt: skip
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [str(python), "-c", "import shoal; print(shoal.__file__)"],
        cwd=work, capture_output=True, text=True, env=env, check=True,
    ).stdout.strip()  # fmt: skip
    assert where.startswith(site), where  # the wheel's shoal, not the checkout's
    version = subprocess.run(
        [str(venv / "bin" / "shoal"), "--version"], cwd=work, capture_output=True, text=True,
        env=env,
    )  # fmt: skip
    assert version.stdout.strip() == f"shoal {shoal.__version__}", version.stderr
    run = subprocess.run(
        [str(venv / "bin" / "shoal"), "train", "--tuned", "ppo-cartpole",
         "--run.total-steps", "2048", "--run-dir", "run", "--run.no-console"],
        cwd=work, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert (work / "run" / "checkpoints" / "latest").exists()


def test_the_top_of_the_python_api_holds_every_command_and_documents_it():
    """``shoal.report``, ``shoal.export`` and ``shoal.tune`` sit beside ``shoal.train``: each
    command line verb has its function at the top, and docs/api.md documents each."""
    import inspect

    import shoal

    api = (Path(__file__).parents[1] / "docs" / "api.md").read_text()
    for name in ("train", "load", "evaluate", "collect", "experiment", "tune", "report", "export"):
        function = getattr(shoal, name)
        assert inspect.isfunction(function) and name in shoal.__all__, name
        assert f"::: {function.__module__}.{name}" in api, name
