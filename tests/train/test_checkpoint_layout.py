"""A checkpoint's layout is known in one module: `shoal.train.checkpoint` writes a
`RunState` and reads its parts back through `Checkpoint`'s properties. Nothing else reads a
checkpoint's files or parts by string key."""

from __future__ import annotations

import ast
from pathlib import Path

from shoal.train import checkpoint as checkpoint_module
from shoal.train.checkpoint import Checkpoint, RunState, load_checkpoint, save_checkpoint

SHOAL = Path(checkpoint_module.__file__).parents[1]
RAW = {"meta", "state"}
"""A `Checkpoint`'s raw files, for its own module."""
TOP_KEYS = {"algorithm", "rng", "loop", "callbacks"}
"""`RunState`'s parts as stored."""


def _names_a_checkpoint(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return "checkpoint" in name or name in ("resume", "ckpt")


def string_key_reads(source: str) -> list[str]:
    """``checkpoint.meta``/``.state`` anywhere, ``checkpoint.config[...]``/``.get(...)``, and
    a subscript by one of `RunState`'s stored names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _names_a_checkpoint(node.value) and node.attr in RAW:
            found.append(f"line {node.lineno}: .{node.attr}")
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            value = node.value
            if not isinstance(value, ast.Attribute):
                continue
            if node.slice.value in TOP_KEYS and (
                value.attr in ("state", "run_state") or _names_a_checkpoint(value)
            ):
                found.append(f"line {node.lineno}: [{node.slice.value!r}]")
            if value.attr == "config" and _names_a_checkpoint(value.value):
                found.append(f"line {node.lineno}: .config[...]")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if (
                node.func.attr == "get"
                and isinstance(owner, ast.Attribute)
                and owner.attr == "config"
                and _names_a_checkpoint(owner.value)
            ):
                found.append(f"line {node.lineno}: .config.get(...)")
    return sorted(found, key=lambda read: (int(read.split()[1].rstrip(":")), read))


def test_no_module_but_the_checkpoint_module_reads_parts_by_string_key():
    offenders = {
        str(path.relative_to(SHOAL.parent)): reads
        for path in sorted(SHOAL.rglob("*.py"))
        if path != Path(checkpoint_module.__file__)
        and (reads := string_key_reads(path.read_text()))
    }
    assert offenders == {}


def test_the_scan_finds_what_it_looks_for():
    source = (
        "x = checkpoint.meta['algo']\n"
        "y = resume.state['loop']\n"
        "z = self.checkpoint.config.get('run')\n"
        "w = checkpoint.policy_weights\n"
    )
    assert string_key_reads(source) == [
        "line 1: .meta", "line 2: .state", "line 2: ['loop']", "line 3: .config.get(...)",
    ]  # fmt: skip


def test_a_run_state_reads_back_by_part(tmp_path):
    """What the session writes is what `Checkpoint`'s properties return."""
    state = RunState(
        algorithm={"policy": {"model": {"w": 1.5}, "obs_stats": None}, "replay": {"n": 3}},
        rng={"torch": 7},
        loop={"next_eval": 100},
        callbacks=[{"best": 2.0}],
    )
    meta = {"spaces": {"observation": "o", "action": "a"}, "joint": True}
    path = save_checkpoint(tmp_path, 42, "ppo", {"run": {"torch_threads": 3}}, state,
                           extra_meta=meta)  # fmt: skip
    read = load_checkpoint(path)
    assert isinstance(read, Checkpoint)
    assert (read.algo, read.env_steps, read.joint) == ("ppo", 42, True)
    assert read.spaces == {"observation": "o", "action": "a"}
    assert read.run_state == state
    assert read.policy_weights == {"w": 1.5} and read.policy_obs_stats is None
    assert read.replay == {"n": 3} and read.self_play_pool is None and not read.replay_dropped
    assert read.setting("run.torch_threads") == 3
    assert read.setting("env.id", "none") == "none"


def test_a_replay_kept_but_not_saved_is_named(tmp_path):
    """A replay learner without ``replay.save`` stores its replay as None: a resume is then
    not exact; an algorithm without a replay has nothing dropped."""
    for algorithm, dropped in (({"replay": None}, True), ({"learner": {}}, False)):
        state = RunState(algorithm=algorithm, rng={}, loop={}, callbacks=None)
        path = save_checkpoint(tmp_path / str(dropped), 1, "dqn", {}, state)
        read = load_checkpoint(path)
        assert (read.replay_dropped, read.replay) == (dropped, None)
