"""One decode step of a small LLM with a KV cache: the `tpudiag compile` example for inference.

Two layers, batch 8, one new token per sequence, cache of 1,024 positions, width 1,024, 8 heads
of 128, MLP 4,096, vocabulary 8,192, bf16. The KV cache and attention heads are sharded over
`model` (tensor parallel), the batch over `data`; the step writes the new K/V at `pos` with a
dynamic update slice and attends over the whole cache with a length mask. Decode is
HBM-bound: every step streams the weights and the cache once.

`tpudiag compile examples/models/llm_decode.py:decode_step --topology v6e:2x2`
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

BATCH, CACHE, WIDTH, HEADS, HEAD_DIM, MLP, VOCAB, LAYERS = 8, 1024, 1024, 8, 128, 4096, 8192, 2

JIT_KWARGS = {"donate_argnums": (1,)}  # the cache is updated in place


def _rms_norm(x, scale):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6) * scale).astype(x.dtype)


def decode_step(params, cache, token_onehot, pos):
    """token_onehot: [batch, vocab] one-hot of the last token; pos: the position to write."""
    x = token_onehot @ params["embed"]  # [b, d]
    b = x.shape[0]
    new_cache = []
    valid = jnp.arange(CACHE) <= pos  # attend to positions written so far
    for layer, (k_cache, v_cache) in zip(params["layers"], cache):
        h = _rms_norm(x, layer["norm1"])
        q, k, v = jnp.split((h @ layer["wqkv"]).reshape(b, 3, HEADS, HEAD_DIM), 3, axis=1)
        q, k, v = q[:, 0], k[:, 0], v[:, 0]  # [b, heads, head_dim]
        k_cache = jax.lax.dynamic_update_slice(k_cache, k[:, None], (0, pos, 0, 0))
        v_cache = jax.lax.dynamic_update_slice(v_cache, v[:, None], (0, pos, 0, 0))
        scores = jnp.einsum("bhd,bshd->bhs", q, k_cache).astype(jnp.float32) / HEAD_DIM ** 0.5
        probs = jax.nn.softmax(jnp.where(valid, scores, -1e9), axis=-1).astype(x.dtype)
        attn = jnp.einsum("bhs,bshd->bhd", probs, v_cache).reshape(b, HEADS * HEAD_DIM)
        x = x + attn @ layer["wo"]
        h = _rms_norm(x, layer["norm2"])
        x = x + jax.nn.silu(h @ layer["w_up"]) @ layer["w_down"]
        new_cache.append((k_cache, v_cache))
    logits = _rms_norm(x, params["norm_f"]) @ params["unembed"]
    return jnp.argmax(logits, axis=-1), new_cache


def example_args(mesh):
    def spec(shape, dtype, *axes):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*axes)))

    bf16 = jnp.bfloat16
    layer = {
        "norm1": spec((WIDTH,), jnp.float32),
        "wqkv": spec((WIDTH, 3 * HEADS * HEAD_DIM), bf16, None, "model"),
        "wo": spec((HEADS * HEAD_DIM, WIDTH), bf16, "model", None),
        "norm2": spec((WIDTH,), jnp.float32),
        "w_up": spec((WIDTH, MLP), bf16, None, "model"),
        "w_down": spec((MLP, WIDTH), bf16, "model", None),
    }
    params = {
        "embed": spec((VOCAB, WIDTH), bf16),
        "layers": [dict(layer) for _ in range(LAYERS)],
        "norm_f": spec((WIDTH,), jnp.float32),
        "unembed": spec((WIDTH, VOCAB), bf16, None, "model"),
    }
    kv = spec((BATCH, CACHE, HEADS, HEAD_DIM), bf16, "data", None, "model", None)
    cache = [(kv, kv) for _ in range(LAYERS)]
    token = spec((BATCH, VOCAB), bf16, "data", None)
    pos = jax.ShapeDtypeStruct((), jnp.int32)
    return params, cache, token, pos
