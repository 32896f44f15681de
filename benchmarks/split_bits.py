"""Whether decode attention gives the same bits for a short context however the split count is bounded:
the model's split count with every split (min_split_len 1), the same with live splits only (256),
and a bound of 256 positions (STRATA_SHORT_GRAPHS: one split). Prints, per head_dim and context, the
largest difference from the first arm. `python benchmarks/split_bits.py [--small]` (small: CPU-sized)."""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from strata.kernels.paged_attention import MIN_SPLIT_LEN, choose_num_splits, paged_decode_attention  # noqa: E402
from tests.test_kernels_paged_attention import make_case  # noqa: E402

device = "cuda" if torch.cuda.is_available() else "cpu"
small = "--small" in sys.argv
contexts = [17, 129] if small else [17, 64, 65, 129, 200, 256]
for head_dim, heads, kv_heads, max_ctx in ((64, 14, 2, 32768), (128, 28, 4, 32768), (128, 28, 4, 131072)):
    if small and head_dim == 128:
        continue
    case = make_case(contexts, heads, kv_heads, head_dim, 16, torch.bfloat16, seed=head_dim)
    q, k, v, tables, lens, _ = case
    args = [t.to(device) for t in (q, k, v, tables, lens)]
    arms = {
        "all splits": dict(max_context_len=max_ctx),
        "live splits": dict(max_context_len=max_ctx, min_split_len=MIN_SPLIT_LEN),
        "bound 256": dict(max_context_len=256),
    }
    outs = {name: paged_decode_attention(*args, block_size=16, **kw) for name, kw in arms.items()}
    base = outs["all splits"]
    splits = choose_num_splits(len(contexts), kv_heads, max_ctx)
    for name, out in outs.items():
        diffs = [(out[i].float() - base[i].float()).abs().max().item() for i in range(len(contexts))]
        print(
            f"d={head_dim} max_ctx={max_ctx} splits={splits} {name:12s} equal={torch.equal(out, base)} "
            + " ".join(f"{c}:{d:.2e}" for c, d in zip(contexts, diffs, strict=True))
        )
