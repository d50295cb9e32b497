"""The intersection as a SUMO road network: ``netconvert`` builds it once (cached under
``~/.cache/shoal/sumo``) from the node, edge and connection files in
``shoal/envs/intersection/sumo/``, with a routes file for the scenario's routes and vehicle
types. The SUMO backend simulates on it; the SMARTS backend reads it as its road map."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
from pathlib import Path

from shoal.core.errors import ConfigError
from shoal.envs.intersection.external import build_once, cache_dir, route_edges
from shoal.envs.intersection.scenario import Scenario

INSTALL = "pip install 'shoal[sumo]'"


FILES = Path(__file__).parent / "sumo"


def require_sumo() -> Path:
    """The ``netconvert`` binary of the installed Eclipse SUMO, or a `ConfigError` that
    names the install command."""
    if importlib.util.find_spec("libsumo") is None or importlib.util.find_spec("sumo") is None:
        raise ConfigError(f"the SUMO backend needs Eclipse SUMO and libsumo: {INSTALL}")
    import sumo

    binary = Path(sumo.SUMO_HOME) / "bin" / "netconvert"
    if not binary.exists():
        raise ConfigError(f"no netconvert in {binary.parent}; reinstall SUMO: {INSTALL}")
    return binary


def build_network(scenario: Scenario) -> tuple[Path, Path]:
    """The network (``netconvert`` on the shipped files) and a routes file for the
    scenario's routes and vehicle types, built once per content into `cache_dir`."""
    netconvert = require_sumo()
    sources = {p.name.split(".")[1]: p.read_text() for p in FILES.glob("intersection.*.xml")}
    if scenario.signals:  # the same box with traffic lights (their states come from shoal)
        centre = 'id="C" x="0" y="0" type='
        sources["nod"] = sources["nod"].replace(centre + '"priority"', centre + '"traffic_light"')
    routes = routes_xml(scenario)
    key = hashlib.sha256(
        "".join(sources[k] for k in sorted(sources)).encode() + routes.encode()
        + str(netconvert).encode()
    ).hexdigest()[:16]  # fmt: skip

    def make(work: Path) -> None:
        for kind, text in sources.items():
            (work / f"intersection.{kind}.xml").write_text(text)
        files = {kind: str(work / f"intersection.{kind}.xml") for kind in sources}
        command = [
            str(netconvert), "--node-files", files["nod"], "--edge-files", files["edg"],
            "--connection-files", files["con"], "--offset.disable-normalization", "true",
            "--no-turnarounds", "true", "-o", str(work / "intersection.net.xml"),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"netconvert failed:\n{done.stderr[-2000:]}")
        (work / "intersection.rou.xml").write_text(routes)

    target = build_once(cache_dir("sumo") / key, make)
    return target / "intersection.net.xml", target / "intersection.rou.xml"


def routes_xml(scenario: Scenario) -> str:
    """Vehicle types ``agent`` and ``background`` (4.5 x 2 m, the built-in discs' extent;
    the background one with the built-in IDM) and route ``r<k>`` for the built-in route
    ``k``."""
    p = scenario.idm
    lines = [
        "<routes>",
        '  <vType id="agent" length="4.5" width="2.0" minGap="0" maxSpeed="12" accel="6" '
        'decel="6" emergencyDecel="9" speedDev="0"/>',
        f'  <vType id="background" length="4.5" width="2.0" minGap="{p.min_gap}" '
        f'maxSpeed="{p.desired_speed}" carFollowModel="IDM" accel="{p.max_accel}" '
        f'decel="{p.comfort_decel}" tau="{p.time_headway}" delta="{p.exponent}" '
        'speedDev="0"/>',
    ]
    for k, key in enumerate(scenario.routes.keys):
        entry, exit_, _ = route_edges(key)
        lines.append(f'  <route id="r{k}" edges="{entry} {exit_}"/>')
    return "\n".join(lines + ["</routes>", ""])
