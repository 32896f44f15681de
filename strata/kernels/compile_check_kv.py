"""`compile_check`'s variants of the K/V write in the matvec store (`kv_in_matvec`): each kernel that
takes it at the tile its model runs (the 0.5B's preloaded matched Q5_0 and Q8_0 at 8 x 1,024, on
fp32 and int8 x, the latter also with a whole block a lane; the 7B's Q4_K int8 at 8 x 2,048; Q6_K's
rows kernel for v), split-K's last split, several rows, both pair layouts."""

from __future__ import annotations

from typing import Any

KV_POINTERS = {
    "kv_pos_ptr": "*i64", "kv_slot_ptr": "*i64", "kv_freq_ptr": "*fp32", "k_cache_ptr": "*bf16",
    "v_cache_ptr": "*bf16", "rope_scale": "fp32",
}  # fmt: skip


def kv_variants() -> list[tuple[str, object, dict[str, Any], dict[str, str]]]:
    from strata.kernels._matvec_legacy import q5_0_matvec_kernel, q8_0_matvec_kernel
    from strata.kernels._matvec_legacy_int8 import legacy_int8_matvec_kernel
    from strata.kernels._matvec_q4k_int8 import q4_k_int8_matvec_kernel
    from strata.kernels._matvec_q6k_rows import q6_k_rows_int8_matvec_kernel

    u8 = {"qs_ptr": "*u8", **KV_POINTERS}
    out: list[tuple[str, object, dict[str, Any], dict[str, str]]] = []
    for head_dim, interleaved in ((64, False), (128, True)):
        kv = dict(KV_Q=14 * head_dim, KV_K=2 * head_dim, HEAD_DIM=head_dim, INTERLEAVED=interleaved)
        one = dict(M=1, M_PAD=1, BLOCK_N=8, BLOCK_K=1024, SPLIT_K=1, HAS_BIAS=True, NUM_WARPS=8, **kv)
        matched = dict(one, PRELOAD=True, MATCHED=True, PDL=1)
        split = dict(one, M=3, M_PAD=4, BLOCK_N=16, BLOCK_K=512, SPLIT_K=2, NUM_WARPS=4)
        name = f"kv head_dim={head_dim} interleaved={interleaved}"
        for kernel, pointers in ((q5_0_matvec_kernel, {**u8, "qh_ptr": "*i32"}), (q8_0_matvec_kernel, u8)):
            out.append((f"{kernel.__name__} {name} preload matched", kernel, matched, pointers))
            out.append((f"{kernel.__name__} {name} M=3 split=2", kernel, split, pointers))
        for qtype, tile in ((6, matched), (8, split)):  # Q5_0 and Q8_0 on int8 x
            legacy = dict(tile, QTYPE=qtype, USE_ASM=True, PDL=1)
            words = {"qs_ptr": "*i32", "qh_ptr": "*i32", **KV_POINTERS}
            kernel = legacy_int8_matvec_kernel
            out.append((f"legacy int8 {qtype} {name} M={tile['M']}", kernel, legacy, words))
            lanes = dict(legacy, LANE_BLOCKS=True)  # a whole block a lane: the preloaded step, several rows
            out.append((f"legacy int8 {qtype} {name} M={tile['M']} lane blocks", kernel, lanes, words))
        int8 = dict(one, BLOCK_K=2048, NUM_WARPS=4, USE_ASM=True, ROWS_AT_ONCE=False, FLAT_ACC=True,
                    SCALAR_SCALES=True, PDL=1)  # fmt: skip
        out.append((f"Q4_K int8 {name} flat_acc scalar_scales", q4_k_int8_matvec_kernel, int8, KV_POINTERS))
        int8_split = dict(split, USE_ASM=True, ROWS_AT_ONCE=False)
        out.append((f"Q4_K int8 {name} M=3 split=2", q4_k_int8_matvec_kernel, int8_split, KV_POINTERS))
    pointers = {"ql_ptr": "*i32", "qh_ptr": "*i32", "sc_ptr": "*i8", "d_ptr": "*fp16", **KV_POINTERS}
    for splits in (1, 32):
        v = dict(R=64, SPLIT_K=splits, HAS_BIAS=False, USE_ASM=True, PDL=True, NUM_WARPS=2, HEAD_DIM=128)
        out.append((f"q6_k_rows kv v split={splits}", q6_k_rows_int8_matvec_kernel, v, pointers))
    return out
