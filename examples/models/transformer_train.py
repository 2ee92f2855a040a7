"""A sharded training step of a small pre-norm transformer: the `tpudiag compile` example.

One block (attention + MLP), bf16 weights, batch 8 x sequence 128, width 512, 4 heads of 128,
MLP 1024, vocabulary 1024 (kept small so a v5e compile with the static profile stays near 20 s). Sharding over the ("data", "model") mesh tpudiag provides:

- activations: batch on `data`;
- weights: FSDP on `data` and tensor-parallel on `model` (QKV and MLP-up column-parallel,
  attention-out and MLP-down row-parallel), so XLA all-gathers weight shards before use and
  reduce-scatters their gradients;
- layer-norm scales are replicated, so their gradients are all-reduced.

`tpudiag compile examples/models/transformer_train.py:train_step --topology v5e:2x2`
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

BATCH, SEQ, WIDTH, HEADS, HEAD_DIM, MLP, VOCAB, LAYERS = 8, 128, 512, 4, 128, 1024, 1024, 1
LR = 1e-3


def _layer_norm(x, scale):
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = ((x32 - mean) ** 2).mean(-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + 1e-6) * scale).astype(x.dtype)


def _block(x, p):
    b, s, _ = x.shape
    h = _layer_norm(x, p["ln1"])
    qkv = h @ p["wqkv"]  # [b, s, 3 * heads * head_dim]
    q, k, v = jnp.split(qkv.reshape(b, s, 3, HEADS, HEAD_DIM), 3, axis=2)
    q, k, v = (t[:, :, 0] for t in (q, k, v))
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / HEAD_DIM ** 0.5
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    probs = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1).astype(x.dtype)
    attn = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, HEADS * HEAD_DIM)
    x = x + attn @ p["wo"]
    h = _layer_norm(x, p["ln2"])
    return x + jax.nn.gelu(h @ p["w_up"]) @ p["w_down"]


def _loss(params, tokens, targets):
    # One-hot matmuls instead of gathers: the static LLO profile aborts on v5e gather fusions.
    x = jax.nn.one_hot(tokens, VOCAB, dtype=params["embed"].dtype) @ params["embed"]
    for p in params["blocks"]:
        x = _block(x, p)
    logits = (_layer_norm(x, params["ln_f"]) @ params["embed"].T).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -(logp * jax.nn.one_hot(targets, VOCAB, dtype=logp.dtype)).sum(-1).mean()


def train_step(params, tokens, targets):
    loss, grads = jax.value_and_grad(_loss)(params, tokens, targets)
    params = jax.tree.map(lambda w, g: (w - LR * g.astype(jnp.float32)).astype(w.dtype), params, grads)
    return params, loss


def example_args(mesh):
    def spec(shape, dtype, *axes):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*axes)))

    bf16 = jnp.bfloat16
    block = {
        "ln1": spec((WIDTH,), jnp.float32),
        "wqkv": spec((WIDTH, 3 * HEADS * HEAD_DIM), bf16, "data", "model"),
        "wo": spec((HEADS * HEAD_DIM, WIDTH), bf16, "model", "data"),
        "ln2": spec((WIDTH,), jnp.float32),
        "w_up": spec((WIDTH, MLP), bf16, "data", "model"),
        "w_down": spec((MLP, WIDTH), bf16, "model", "data"),
    }
    params = {
        "embed": spec((VOCAB, WIDTH), bf16, "model", "data"),
        "ln_f": spec((WIDTH,), jnp.float32),
        "blocks": [dict(block) for _ in range(LAYERS)],
    }
    tokens = spec((BATCH, SEQ), jnp.int32, "data")
    return params, tokens, tokens
