"""Pallas kernels for lsjax's hybrid tree attention.

* `prefix_attention`: flash-decoding of a few queries over a long committed KV cache.
* `tree_attention`: masked attention among the speculative tree tokens.
* `invariant_attention`: the cache part of batch-invariant attention, each query below its own bound (GPU);
  returns the online softmax state, which the XLA window part continues.

Both return `(out, lse)` so `lsjax.attention.merge_attention` can combine them exactly.
Each module also holds a frozen tuning dataclass and a naive pure-jnp `*_reference`.
"""
