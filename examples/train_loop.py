"""A small JAX training loop that runs anywhere (CPU, GPU or TPU): the program `tpudiag run` profiles.

    tpudiag run -- python examples/train_loop.py             # the whole run
    tpudiag run --steps 3..4 -- python examples/train_loop.py  # steps 3 and 4 only

A two-layer MLP fitted to a fixed random regression target by plain SGD. Each step is marked
with `jax.profiler.StepTraceAnnotation`, as training loops usually are, so a capture has steps.
Nothing here knows about tpudiag.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp


def init(key, d_in: int = 256, d_hidden: int = 1024, d_out: int = 64):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (d_in, d_hidden)) / d_in ** 0.5,
            "w2": jax.random.normal(k2, (d_hidden, d_out)) / d_hidden ** 0.5}


def loss(params, x, y):
    h = jax.nn.gelu(x @ params["w1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


@jax.jit
def train_step(params, x, y):
    value, grads = jax.value_and_grad(loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    kx, ky, kp = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (args.batch, 256))
    y = jax.random.normal(ky, (args.batch, 64))
    params = init(kp)
    for step in range(args.steps):
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            params, value = train_step(params, x, y)
            value.block_until_ready()
    print(f"loss after {args.steps} steps: {float(value):.4f}")


if __name__ == "__main__":
    main()
