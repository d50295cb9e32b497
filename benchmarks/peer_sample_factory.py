"""Sample Factory side of ``benchmarks/peers.py``: asynchronous PPO (APPO) on Pong.

Sample Factory 2's own Atari trainer (``sf_examples.atari.train_atari``, its APPO: rollout
workers, an inference worker and a learner in separate processes, double-buffered sampling)
with the ``ppo-pong`` row's settings: 8 envs (2 workers x 4), 128-step rollouts, 4 epochs of
4 minibatches of 256, lr 2.5e-4, clip 0.1, its Nature-style CNN, on the CPU. Frames/s from
its own reports ("Total num frames" over time, counting frames with the frame skip of 4),
from the second report on (start-up left out). Only the Pong row: Sample Factory has no
CartPole, SAC or DQN. Runs in ``.venv-sf`` (gymnasium 0.29 and ale-py 0.9, which Sample
Factory's pins allow; ale-py registers its Atari ids here, before Sample Factory's processes
start, as its plugin import loops under gymnasium 0.29).
"""

from __future__ import annotations

import re
import sys
import tempfile
import time

import ale_py  # noqa: F401  (registers the Atari ids in every process that imports this)
import gymnasium  # noqa: F401
from peer_settings import ROWS, report, side_parser

FRAMES = re.compile(r"Total num frames: (\d+)")


class Tee:
    """Keeps Sample Factory's log lines with the time each arrived."""

    def __init__(self, stream):
        self.stream, self.lines = stream, []

    def write(self, text: str) -> int:
        self.lines.append((time.perf_counter(), text))
        return len(text)

    def flush(self) -> None:
        pass


def main() -> None:
    args = side_parser(__doc__).parse_args()
    if args.row != "ppo-pong":
        raise SystemExit("Sample Factory runs the ppo-pong row only")
    row = ROWS[args.row]
    from sf_examples.atari.train_atari import main as train_atari

    frames = 4 * (row["throughput_steps"] + 4 * row["num_envs"] * row["num_steps"])
    argv = [
        "--env=atari_pong", "--experiment=peers", f"--train_dir={tempfile.mkdtemp()}",
        "--num_workers=2", "--num_envs_per_worker=4", "--worker_num_splits=2",
        f"--rollout={row['num_steps']}", f"--batch_size={row['minibatch_size']}",
        "--num_batches_per_epoch=4", f"--num_epochs={row['num_epochs']}",
        f"--learning_rate={row['lr']}", f"--ppo_clip_ratio={row['clip_eps']}",
        f"--exploration_loss_coeff={row['ent_coef']}", f"--value_loss_coeff={row['vf_coef']}",
        f"--max_grad_norm={row['max_grad_norm']}", f"--gamma={row['gamma']}",
        f"--gae_lambda={row['gae_lambda']}", f"--train_for_env_steps={frames}",
        "--device=cpu", "--with_wandb=False", "--save_every_sec=100000",
        "--experiment_summaries_interval=2", f"--seed={args.seed}",
    ]  # fmt: skip
    sys.argv = [sys.argv[0], *argv]
    import logging

    tee = Tee(sys.stderr)
    handler = logging.StreamHandler(tee)
    logging.getLogger().addHandler(handler)
    for name in ("rl",):
        logging.getLogger(name).addHandler(handler)
    train_atari()
    points = [(t, int(m.group(1))) for t, line in tee.lines if (m := FRAMES.search(line))]
    if len(points) < 3:
        raise SystemExit(f"Sample Factory reported {len(points)} frame counts; cannot time it")
    (t0, f0), (t1, f1) = points[1], points[-1]
    from importlib.metadata import version

    report({"frames_per_s": (f1 - f0) / (t1 - t0), "env_steps_per_s": (f1 - f0) / (t1 - t0) / 4,
            "frames": f1 - f0, "version": version("sample-factory")})  # fmt: skip


if __name__ == "__main__":
    main()
