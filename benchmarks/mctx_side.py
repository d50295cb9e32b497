"""mctx's side of benchmarks/search.py, run in its own virtual environment
(``make .venv-mctx/.installed``): ``mctx.muzero_policy`` over the same shape of learned model
(latent 32, 8 actions, dynamics and prediction MLPs of 64), 64 simulations, no root noise,
compiled with ``jax.jit`` before timing. Prints one JSON line with simulations per second.

Usage: ``python mctx_side.py --batch 256 --repeats 3``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import mctx

LATENT, ACTIONS, HIDDEN, SIMULATIONS = 32, 8, 64, 64


def init(key: jax.Array) -> dict:
    k = jax.random.split(key, 4)

    def dense(key: jax.Array, n_in: int, n_out: int) -> tuple:
        return (jax.random.normal(key, (n_in, n_out)) / jnp.sqrt(n_in), jnp.zeros(n_out))

    return {"d1": dense(k[0], LATENT + ACTIONS, HIDDEN), "d2": dense(k[1], HIDDEN, LATENT),
            "p1": dense(k[2], LATENT, HIDDEN), "p2": dense(k[3], HIDDEN, ACTIONS + 2)}  # fmt: skip


def predict(params: dict, latent: jax.Array) -> jax.Array:
    hidden = jax.nn.relu(latent @ params["p1"][0] + params["p1"][1])
    return hidden @ params["p2"][0] + params["p2"][1]


def recurrent_fn(params, rng, action, latent):
    hot = jax.nn.one_hot(action, ACTIONS)
    hidden = jax.nn.relu(jnp.concatenate([latent, hot], -1) @ params["d1"][0] + params["d1"][1])
    nxt = jnp.tanh(hidden @ params["d2"][0] + params["d2"][1])
    out = predict(params, nxt)
    output = mctx.RecurrentFnOutput(
        reward=out[:, ACTIONS + 1],
        discount=jnp.full(out.shape[:1], 0.997),
        prior_logits=out[:, :ACTIONS],
        value=out[:, ACTIONS],
    )
    return output, nxt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    params = init(jax.random.PRNGKey(0))
    latent = jax.random.normal(jax.random.PRNGKey(args.batch), (args.batch, LATENT))

    @jax.jit
    def policy(params, rng, latent):
        out = predict(params, latent)
        root = mctx.RootFnOutput(prior_logits=out[:, :ACTIONS], value=out[:, ACTIONS],
                                 embedding=latent)  # fmt: skip
        return mctx.muzero_policy(params, rng, root, recurrent_fn, num_simulations=SIMULATIONS,
                                  dirichlet_fraction=0.0)  # fmt: skip

    tick = time.perf_counter()
    jax.block_until_ready(policy(params, jax.random.PRNGKey(1), latent))
    compile_s = time.perf_counter() - tick
    rates = []
    for i in range(args.repeats):
        tick = time.perf_counter()
        jax.block_until_ready(policy(params, jax.random.PRNGKey(2 + i), latent))
        rates.append(args.batch * SIMULATIONS / (time.perf_counter() - tick))
    print(json.dumps({"batch": args.batch, "rate": statistics.median(rates),
                      "compile_s": compile_s, "jax": jax.__version__}))  # fmt: skip


if __name__ == "__main__":
    main()
