"""Exact comparison of nested checkpoint states and of logged metrics, shared by the
algorithm tests; and the resume check of runs that cannot be compared exactly."""

import json

import numpy as np
import torch

import shoal
from shoal.train.checkpoint import load_checkpoint


def flatten_state(tree, prefix=""):
    """``{path: leaf}`` of a nested dict/list state, for exact comparisons with useful names."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return {prefix: tree}
    flat = {}
    for key, value in items:
        flat.update(flatten_state(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def assert_states_equal(got, want):
    got, want = flatten_state(got), flatten_state(want)
    assert got.keys() == want.keys()
    for path, a in got.items():
        b = want[path]
        if isinstance(a, torch.Tensor):
            assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, path
            assert torch.equal(a, b), path
        elif isinstance(a, np.ndarray):
            assert isinstance(b, np.ndarray) and a.dtype == b.dtype, path
            assert np.array_equal(a, b), path
        else:
            assert type(a) is type(b) and a == b, path


def metric_rows(run_dir):
    """The logged metrics of a run, one dict per iteration, without the timing (perf/*) and
    without the final evaluations (``eval/final``: a run stopped and resumed has one more, at
    the step where it stopped)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return [
        {k: v for k, v in row.items() if not k.startswith("perf/")}
        for row in rows
        if "eval/final" not in row
    ]


def assert_resume_goes_on(run_dir, total_steps):
    """Resume ``run_dir`` to ``total_steps`` and check that its learner goes on from the
    checkpoint's gradient steps: for runs whose actors and learner interleave by timing
    (Ape-X), where a resume cannot equal an unbroken run. Returns the resumed run."""
    saved = load_checkpoint(run_dir).state["algorithm"]["learner"]["grad_steps"]
    resumed = []
    again = shoal.train(resume=run_dir, total_steps=total_steps,
                        on_iteration=lambda step, metrics: resumed.append(metrics))  # fmt: skip
    assert again.env_steps >= total_steps
    assert resumed[0]["train/grad_steps"] >= saved and resumed[-1]["train/grad_steps"] > saved
    return again
