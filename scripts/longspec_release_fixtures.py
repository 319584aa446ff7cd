"""Fixtures of the released LongSpec draft layer's outputs, from the authors' code, for
`tests/test_longspec_release.py`.

Runs `LlamaGlideDecoderLayer` of sail-sg/LongSpec at commit 15e4998 (`longspec/test/llama_glide.py`) on CPU: the
file is read from a clone (`--repo`) and executed with its CUDA-only imports replaced by plain torch equivalents
defined here, which this script states and which follow flash-attn's documented semantics:

* `flash_attn_func(q, k, v, causal, window_size)` and `flash_attn_with_kvcache(q, k_cache, v_cache, k, v,
  window_size, causal, cache_seqlens, return_softmax_lse)`: softmax attention with GQA; with `k`/`v` given they
  are written into the cache at `cache_seqlens` first; query i of Tq is aligned to key index seqlen_k - Tq + i
  (bottom right): causal keeps keys <= that index, a window (left, right) keeps keys in [index - left,
  index + right] (-1: unbounded); the lse is natural-log, [B, N, Tq];
* the Triton tree attention (`triton_tree_attn.attention`): masked softmax attention returning (out [B, N, T, H],
  lse [B, N, T]);
* `llama` (the repo's own Llama with its `exec_type` paths): only its RoPE, RMSNorm, MLP and `apply_rotary_pos_emb`
  are used by the layer, taken from transformers' Llama; `Tensor.cuda` is the identity.

The driver replays the draft's side of `LlamaGlide.tree_spec_generate` (prefill, then rounds of a root step on
the accepted tokens and beam-tree steps), with a random target cache, embedding and LM head standing in for the
target, a 600-token prompt so the 512-token window binds, and a fixed acceptance per round. The reference code is
not copied into lsjax; only the numbers it produced are saved.

    python scripts/longspec_release_fixtures.py --repo CLONE_OF_sail-sg/LongSpec --out tests/fixtures/longspec_release
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import torch

COMMIT = "15e4998"


def _attend(q, k, v, keep):
    """q [B, Tq, N, H], k/v [B, Tk, K, H], keep [B or 1, Tq, Tk] -> out [B, Tq, N, H], lse [B, N, Tq]."""
    N, K = q.shape[2], k.shape[2]
    k = k.repeat_interleave(N // K, dim=2).float()
    v = v.repeat_interleave(N // K, dim=2).float()
    s = torch.einsum("bqnh,bknh->bnqk", q.float(), k) / q.shape[-1] ** 0.5
    s = s.masked_fill(~keep[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("bnqk,bknh->bqnh", p, v).to(q.dtype).contiguous(), lse


def _keep(tq, tk, causal, window, kv_len=None):
    """[B or 1, tq, tk] bool: flash-attn's bottom-right alignment over kv_len [B] valid keys (default tk)."""
    kv_len = torch.full((1,), tk) if kv_len is None else kv_len.long()
    i = torch.arange(tq)[None, :, None]
    j = torch.arange(tk)[None, None, :]
    at = kv_len[:, None, None] - tq + i
    keep = j < kv_len[:, None, None]
    left, right = window
    if causal:
        keep = keep & (j <= at)
    if left >= 0:
        keep = keep & (j >= at - left)
    if right >= 0:
        keep = keep & (j <= at + right)
    return keep


def flash_attn_func(q, k, v, causal=False, window_size=(-1, -1), **_):
    return _attend(q, k, v, _keep(q.shape[1], k.shape[1], causal, window_size))[0]


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    window_size=(-1, -1),
    causal=False,
    cache_seqlens=None,
    return_softmax_lse=False,
    **_,
):
    B, tq = q.shape[:2]
    lens = cache_seqlens.long()
    if k is not None:
        for b in range(B):
            k_cache[b, lens[b] : lens[b] + k.shape[1]] = k[b]
            v_cache[b, lens[b] : lens[b] + v.shape[1]] = v[b]
        lens = lens + k.shape[1]
    out, lse = _attend(q, k_cache, v_cache, _keep(tq, k_cache.shape[1], causal, window_size, lens))
    return (out, lse) if return_softmax_lse else out


def tree_attention(q, k, v, tree_mask, sm_scale=None, return_log_normalizer=True):
    out, lse = _attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), tree_mask.bool())
    return out.transpose(1, 2).contiguous(), lse


def load_reference(repo: Path, arch: str):
    from transformers.models.llama import modeling_llama as ml
    from transformers.models.qwen2 import modeling_qwen2 as mq

    torch.Tensor.cuda = lambda self, *a, **k: self
    # qwen2_glide.py imports Liger's fused loss (training only): a stand-in that is never called.
    sys.modules["liger_kernel"] = types.ModuleType("liger_kernel")
    sys.modules["liger_kernel.transformers"] = types.SimpleNamespace(LigerFusedLinearCrossEntropyLoss=None)
    sys.modules["qwen2"] = types.SimpleNamespace(
        Qwen2ForCausalLM=mq.Qwen2ForCausalLM,
        Qwen2RotaryEmbedding=mq.Qwen2RotaryEmbedding,
        Qwen2RMSNorm=mq.Qwen2RMSNorm,
        Qwen2MLP=mq.Qwen2MLP,
        apply_rotary_pos_emb=mq.apply_rotary_pos_emb,
    )
    sys.modules["flash_attn"] = types.SimpleNamespace(
        flash_attn_func=flash_attn_func, flash_attn_with_kvcache=flash_attn_with_kvcache
    )
    sys.modules["triton_tree_attn"] = types.SimpleNamespace(attention=tree_attention)
    sys.modules["llama"] = types.SimpleNamespace(
        LlamaForCausalLM=ml.LlamaForCausalLM,
        LlamaRotaryEmbedding=ml.LlamaRotaryEmbedding,
        LlamaRMSNorm=ml.LlamaRMSNorm,
        LlamaMLP=ml.LlamaMLP,
        apply_rotary_pos_emb=ml.apply_rotary_pos_emb,
    )
    src = subprocess.run(
        ["git", "-C", str(repo), "show", f"{COMMIT}:longspec/test/{arch}_glide.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    mod = types.ModuleType(f"{arch}_glide")
    sys.modules[f"{arch}_glide"] = mod
    exec(compile(src, f"{arch}_glide.py", "exec"), mod.__dict__)  # noqa: S102 - the pinned reference, for numbers
    return mod


def training_fixture(layer, rotary, embed, lm_head, V: int, K: int, H: int, T: int = 700) -> dict:
    """The layer's training forward (`exec_type="training"`: causal self-attention in a 512 window, the flash noisy
    cross-attention at the lag `random.randint(1, 4)` draws, MLP) on one 700-token row with anchor-offset
    positions (4 sink tokens, then + 1000, as `LlamaGlide.forward` draws them), then `LlamaGlide.compute_loss`'s
    cross-entropy (the fused Liger loss computes the same mean) of the target's LM head on the draft's last
    hidden state against the next tokens, padding (id 0) ignored. The target's last-layer K/V are random
    stand-ins, given as the layer receives them (after RoPE)."""
    rng = np.random.default_rng(1)
    tokens = torch.as_tensor(rng.integers(1, V, (1, T)))
    tokens[:, -5:] = 0  # padding: labels -100
    sink, offset = 4, 1000
    pos = torch.arange(T)[None].clone()
    pos[:, sink:] += offset
    tk = torch.randn(1, T, K, H)
    tv = torch.randn(1, T, K, H)
    random.seed(7)
    lag = random.randint(1, 4)  # what the layer's own draw will be after the same seed
    random.seed(7)
    with torch.no_grad():
        h = embed[tokens]
        hidden = layer(h, rotary(h, pos), (tk, tv), exec_type="training")
        labels = tokens.clone()
        labels[labels.eq(0)] = -100
        logits = (hidden @ lm_head.T).float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1))
    return {
        "train_tokens": tokens.numpy(),
        "train_offset": np.asarray([offset]),
        "train_sink": np.asarray(sink),
        "train_k": tk.numpy(),
        "train_v": tv.numpy(),
        "train_lag": np.asarray(lag),
        "train_loss": np.asarray(loss.item()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True, type=Path, help="a clone of sail-sg/LongSpec holding commit " + COMMIT)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    for arch in ("llama", "qwen2"):
        fixtures(args.repo, args.out, arch)
    return 0


# The fixture shapes: a Llama one (GQA 2:1, rope 1e4) and a Qwen2 one (GQA 6:1, rope 1e6).
SHAPES = {"llama": dict(V=97, D=64, N=4, K=2, F=96, theta=1e4), "qwen2": dict(V=89, D=96, N=6, K=1, F=80, theta=1e6)}


def fixtures(repo: Path, out_dir: Path, arch: str) -> None:
    from transformers import LlamaConfig, Qwen2Config
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    ref = load_reference(repo, arch)
    torch.manual_seed(0)
    sh = SHAPES[arch]
    V, D, N, K, F, P = sh["V"], sh["D"], sh["N"], sh["K"], sh["F"], 600
    H = D // N
    config = (LlamaConfig if arch == "llama" else Qwen2Config)(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=F,
        num_attention_heads=N,
        num_key_value_heads=K,
        num_hidden_layers=1,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": sh["theta"]},
    )
    config._attn_implementation = "eager"
    config.rope_theta = sh["theta"]  # transformers 5 keeps it in rope_parameters; the 2024 layer reads the attribute
    layer = (ref.LlamaGlideDecoderLayer if arch == "llama" else ref.Qwen2GlideDecoderLayer)(config).float().eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(torch.randn_like(p) * (0.08 if "norm" not in name else 0.1) + (1.0 if "norm" in name else 0.0))
    rotary = (LlamaRotaryEmbedding if arch == "llama" else Qwen2RotaryEmbedding)(config=config)
    embed = torch.randn(V, D) * 0.5
    lm_head = torch.randn(V, D) * 0.15
    S = P + 64
    tk = torch.randn(1, S, K, H)
    tv = torch.randn(1, S, K, H)
    rng = np.random.default_rng(0)
    prompt = torch.as_tensor(rng.integers(0, V, (1, P)))
    shape = [2, 3, 3]
    acc = [0] + list(np.cumsum(shape))
    acc = [a + 1 for a in acc]  # acc_num_per_step: 1, 3, 6, 9
    T = acc[-1]

    def glide(x_ids, pos, cache_lens, llm_len, exec_type, mask=None):
        h = embed[x_ids]
        pe = rotary(h, pos)
        return layer(
            h,
            pe,
            (tk, tv),
            cache_lens=cache_lens.clone(),
            exec_type=exec_type,
            llm_kv_len=llm_len.clone(),
            tree_mask=mask,
        )

    out = {
        "prompt": prompt.numpy(),
        "embed": embed.numpy(),
        "lm_head": lm_head.numpy(),
        "k": tk.numpy(),
        "v": tv.numpy(),
        "shape": np.asarray(shape),
    }
    with torch.no_grad():
        layer.set_max_gen_len(64 + 256)
        n = torch.tensor([P], dtype=torch.int32)
        llm = torch.tensor([P], dtype=torch.int32)
        glide(prompt, torch.arange(P)[None], n, llm, "prefill")
        acc_ids = torch.as_tensor([[int(rng.integers(0, V))]])
        accept = [2, 1, 3]  # tokens committed per round (the root and the accepted nodes), then the bonus
        for r in range(3):
            a = acc_ids.shape[1]
            pos = torch.arange(a)[None] + n[:, None]
            hs = glide(acc_ids, pos, n, llm, "decoding")
            n = n + a - 1
            logp = (hs[:, a - 1] @ lm_head.T).float().log_softmax(-1)
            levels = [logp.numpy()]
            top, ids = logp.topk(shape[0])
            tokens = torch.zeros(1, T, dtype=torch.long)
            tokens[:, 0] = acc_ids[:, -1]
            tokens[:, 1 : acc[1]] = ids
            parents = torch.zeros(1, T, dtype=torch.long)
            hist = torch.zeros(1, T)
            hist[:, 1 : acc[1]] = top
            mask = torch.zeros(1, T, T, dtype=torch.long)
            mask[:, :, 0] = 1
            mask[:, range(1, acc[1]), range(1, acc[1])] = 1
            cur = mask[:, 1 : acc[1], : acc[1]]
            for ms in range(1, len(shape)):
                q = tokens[:, acc[ms - 1] : acc[ms]] if ms > 1 else tokens[:, 1 : acc[1]]
                lo, hi = (acc[ms - 1], acc[ms]) if ms > 1 else (1, acc[1])
                p = n[:, None] + cur.sum(-1) - 1
                hs = glide(q, p, n, llm, "tree_decoding", cur)
                lp = (hs @ lm_head.T).float().log_softmax(-1)
                levels.append(lp.numpy())
                cand = (lp + hist[:, lo:hi, None]).reshape(1, -1)
                best, flat = cand.topk(shape[ms])
                father = flat // V + lo
                kids = flat % V
                s0, s1 = acc[ms], acc[ms + 1]
                mask[0, s0:s1] = mask[0, father[0]]
                mask[0, range(s0, s1), range(s0, s1)] = 1
                cur = mask[:, s0:s1, :s1]
                tokens[:, s0:s1] = kids
                parents[:, s0:s1] = father
                hist[:, s0:s1] = best
            n = n + 1
            # This round's acceptance: the root and the first child chain of `accept[r] - 1` nodes, then a bonus.
            path = [0]
            for _ in range(accept[r] - 1):
                kids = [j for j in range(T) if parents[0, j] == path[-1] and j > 0]
                path.append(kids[0])
            committed = tokens[0, path]
            bonus = int(rng.integers(0, V))
            out[f"round{r}_root"] = acc_ids[0].numpy()
            out[f"round{r}_tokens"] = tokens[0].numpy()
            out[f"round{r}_parents"] = parents[0].numpy()
            for d, lv in enumerate(levels):
                out[f"round{r}_level{d}"] = lv[0]
            out[f"round{r}_committed"] = committed.numpy()
            llm = llm + accept[r]
            acc_ids = torch.cat([committed[1:], torch.tensor([bonus])])[None]
    if arch == "llama":
        out |= training_fixture(layer, rotary, embed, lm_head, V, K, H)
    out_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.numpy() for k, v in layer.state_dict().items()}
    np.savez_compressed(out_dir / f"{arch}.npz", **out, **{f"w:{k}": v for k, v in sd.items()})
    (out_dir / "SOURCE.json").write_text(
        json.dumps(
            {"repository": "sail-sg/LongSpec", "commit": COMMIT, "script": "scripts/longspec_release_fixtures.py"}
        )
    )
    print(f"wrote {out_dir / f'{arch}.npz'}: {len([k for k in out if k.endswith('_root')])} rounds")


if __name__ == "__main__":
    raise SystemExit(main())
