"""Print pip constraints that pin each of shoal's core dependencies to the floor
pyproject.toml states (``numpy>=1.26`` -> ``numpy==1.26``), torch to ``--torch`` (a full
version: the floor's patch release), for ``make test-floors``."""

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def floors(pyproject: str) -> dict[str, str]:
    """Each core dependency's floor, by name, from the [project] table's dependencies."""
    deps = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.S | re.M)
    if deps is None:
        raise SystemExit("pyproject.toml has no dependencies list")
    return dict(re.findall(r'"([A-Za-z0-9_.-]+)>=([0-9.]+)"', deps.group(1)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", required=True, help="the torch version to pin")
    args = parser.parse_args()
    pins = floors((ROOT / "pyproject.toml").read_text())
    pins["torch"] = args.torch
    print("\n".join(f"{name}=={version}" for name, version in pins.items()))
