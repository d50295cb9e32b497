"""The benchmark scripts imported as modules, for tests of their pure parts."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
    """``benchmarks/NAME.py`` imported as a module (the benchmarks are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
