"""Compile the Triton kernels for a GPU target without a GPU: `python -m strata.kernels.compile_check`.

Triton's interpreter (how the kernels run on a CPU, and in CI) accepts some programs its compiler
rejects, e.g. a shape tuple built from `.shape` inside a nested jit function, which reached the H200
as a compile error after passing every interpreter test. This runs the compiler's front end and
ptxas (shipped with Triton) for sm_90 on each kernel at representative constexprs, so such errors
show on any machine. Needs TRITON_INTERPRET unset (the jit functions must be compiled ones); prints
one line per kernel variant, with its layout conversions and barriers inside loops (a conversion
that is not a no-op goes through shared memory between two barriers, every iteration), and exits 1
if any fails.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

from strata.kernels.compile_check_kv import kv_variants
from strata.kernels.sass import barriers_in_loops, decodes_after_wait

# Pointer element types by argument name; kernels override where theirs differ.
POINTERS = {
    "x_ptr": "*bf16", "xq_ptr": "*i32", "xd_ptr": "*fp32", "xs_ptr": "*fp32", "y_ptr": "*fp32",
    "out_ptr": "*bf16", "lock_ptr": "*i32", "b_ptr": "*bf16", "d_ptr": "*fp16", "dm_ptr": "*fp16",
    "sc_ptr": "*u8", "mn_ptr": "*u8",
}  # fmt: skip


def variants() -> list[tuple[str, object, dict[str, Any], dict[str, str]]]:
    from strata.kernels._int8_x import quantize_x_kernel
    from strata.kernels._matvec_kquant import q4_k_matvec_kernel, q6_k_matvec_kernel
    from strata.kernels._matvec_legacy import q5_0_matvec_kernel, q8_0_matvec_kernel
    from strata.kernels._matvec_legacy_int8 import legacy_int8_matvec_kernel
    from strata.kernels._matvec_q4k_int8 import q4_k_int8_matvec_kernel
    from strata.kernels._matvec_q4k_planar import q4_k_planar_matvec_kernel
    from strata.kernels._matvec_q6k_int8 import q6_k_int8_matvec_kernel

    out: list[tuple[str, object, dict[str, Any], dict[str, str]]] = []
    for planar in (False, True):
        for act in (0, 1, 2):
            consts = {"NSB": 32, "PLANAR": planar, "ACT": act, "USE_ASM": True}
            out.append(
                (f"quantize_x planar={planar} act={act}", quantize_x_kernel, consts, {"up_ptr": "*bf16"})
            )
    u8 = {n: "*u8" for n in ("w_ptr", "ql_ptr", "qh_ptr", "qs_ptr")}
    u8q5 = {**u8, "qh_ptr": "*i32"}
    for m, m_pad, split in ((1, 1, 1), (3, 4, 2)):
        tile = dict(M=m, M_PAD=m_pad, BLOCK_N=16, BLOCK_K=512, SPLIT_K=split, HAS_BIAS=split > 1)
        name = f"M={m} split={split}"
        # The int8-x matvecs.
        int8 = dict(tile, USE_ASM=True)
        for qtype in (6, 8):
            legacy = dict(int8, QTYPE=qtype)
            out.append((f"legacy int8 {qtype} {name}", legacy_int8_matvec_kernel, legacy, {}))
            if m > 1:  # batched decode with a whole block a lane
                lanes = dict(legacy, LANE_BLOCKS=True)
                out.append((f"legacy int8 {qtype} {name} lane blocks", legacy_int8_matvec_kernel, lanes, {}))
            if m == 1:  # the matched loop, and its one step preloaded at the 0.5B's tile (8 x 1,024)
                matched = dict(legacy, MATCHED=True, PDL=1)
                out.append((f"legacy int8 {qtype} {name} matched", legacy_int8_matvec_kernel, matched, {}))
                full = dict(matched, PRELOAD=True, BLOCK_N=8, BLOCK_K=1024, NUM_WARPS=8, HAS_BIAS=True)
                out.append(
                    (f"legacy int8 {qtype} 8x1024 preload matched", legacy_int8_matvec_kernel, full, {})
                )
                # a whole block a lane: the loop of longer rows' tile, and the one-step tile preloaded
                loop = dict(matched, BLOCK_N=8, BLOCK_K=1024, NUM_WARPS=8)
                for at, lanes in ((" 8x1024", loop), (" 8x1024 preload", full)):
                    lanes = dict(lanes, LANE_BLOCKS=True)
                    out.append((f"legacy int8 {qtype}{at} lane blocks", legacy_int8_matvec_kernel, lanes, {}))
        out.append((f"Q6_K int8 {name}", q6_k_int8_matvec_kernel, int8, {"sc_ptr": "*i8"}))
        q6_scalar = dict(int8, SCALAR_SCALES=True)
        out.append((f"Q6_K int8 {name} scalar_scales", q6_k_int8_matvec_kernel, q6_scalar, {"sc_ptr": "*i8"}))
        q6_ahead = dict(int8, PREFETCH=True)
        out.append((f"Q6_K int8 {name} prefetch", q6_k_int8_matvec_kernel, q6_ahead, {"sc_ptr": "*i8"}))
        q4k = q4_k_int8_matvec_kernel
        for at_once in (False, True):
            out.append(
                (f"Q4_K int8 {name} rows_at_once={at_once}", q4k, dict(int8, ROWS_AT_ONCE=at_once), {})
            )
        if m == 1:
            flat = dict(int8, ROWS_AT_ONCE=False, FLAT_ACC=True)
            out.append((f"Q4_K int8 {name} flat_acc", q4k, flat, {}))
            out.append((f"Q4_K int8 {name} flat_acc scalar_scales", q4k, dict(flat, SCALAR_SCALES=True), {}))
            ahead = dict(flat, SCALAR_SCALES=True, PREFETCH=True)
            out.append((f"Q4_K int8 {name} flat_acc scalar_scales prefetch", q4k, ahead, {}))
            paired = dict(flat, SCALAR_SCALES=True, PAIRED_DM=True)
            out.append(
                (f"Q4_K int8 {name} flat_acc scalar_scales paired_dm", q4k, paired, {"dm_ptr": "*i32"})
            )
            # Programmatic dependent launch (strata.kernels.pdl): main() checks the PTX's wait and, at
            # PDL 2, the weight prefetches before it.
            out.append((f"Q4_K int8 {name} flat_acc pdl", q4k, dict(flat, PDL=True), {}))
            # preload (MatvecConfig.preload): main() checks that a weight load precedes the wait.
            preload = dict(flat, SCALAR_SCALES=True, PRELOAD=True, PDL=1)
            out.append((f"Q4_K int8 {name} flat_acc scalar_scales pdl preload", q4k, preload, {}))
            q6_preload = dict(int8, PRELOAD=True, PDL=1)
            out.append(
                (f"Q6_K int8 {name} pdl preload", q6_k_int8_matvec_kernel, q6_preload, {"sc_ptr": "*i8"})
            )
            q8_0 = (q8_0_matvec_kernel, {**u8, "qs_ptr": "*i8"})
            for kernel, pointers in (q8_0, (q5_0_matvec_kernel, u8q5)):
                out.append((f"{kernel.__name__} {name} pdl prefetch", kernel, dict(tile, PDL=2), pointers))
                matched = dict(tile, MATCHED=True, PDL=2)
                out.append((f"{kernel.__name__} {name} matched loads", kernel, matched, pointers))
                preload = dict(tile, PRELOAD=True, PDL=1)
                out.append((f"{kernel.__name__} {name} pdl preload", kernel, preload, pointers))
                preload = dict(preload, MATCHED=True)
                out.append((f"{kernel.__name__} {name} pdl preload matched", kernel, preload, pointers))
                # The default tile of the 0.5B's matvecs (8 x 1,024, 8 warps), with bias.
                full = dict(preload, BLOCK_N=8, BLOCK_K=1024, HAS_BIAS=True, NUM_WARPS=8)
                out.append((f"{kernel.__name__} {name} pdl preload matched 8x1024", kernel, full, pointers))
        # The fp32-x matvecs, split (their shared store_rows) and not.
        for kernel, pointers in (
            (q8_0_matvec_kernel, {**u8, "qs_ptr": "*i8"}),
            (q5_0_matvec_kernel, u8q5),
            (q4_k_matvec_kernel, {**u8, "w16_ptr": "*fp16"}),
            (q6_k_matvec_kernel, {**u8, "sc_ptr": "*i8"}),
        ):
            out.append((f"{kernel.__name__} {name}", kernel, tile, pointers))
        if m == 1:
            out.append(
                (f"q5_0_matvec_kernel {name} flat_acc", q5_0_matvec_kernel, dict(tile, FLAT_ACC=True), u8q5)
            )
        planar = q4_k_planar_matvec_kernel
        out.append((f"Q4_K planar {name}", planar, dict(tile, PREFETCH=split > 1), {"qs_ptr": "*i32"}))
        paired = dict(tile, PREFETCH=False, PAIRED_DM=True)
        out.append((f"Q4_K planar {name} paired_dm", planar, paired, {"qs_ptr": "*i32", "dm_ptr": "*i32"}))
        # SwiGLU in the x loads (`x_loads.load_x`): the down projection's gate and up.
        gated, up = dict(tile, GATED=True), {"up_ptr": "*bf16"}
        out.append(
            (f"Q4_K planar {name} gated", planar, dict(gated, PREFETCH=False), {"qs_ptr": "*i32", **up})
        )
        out.append(
            (f"q6_k_matvec_kernel {name} gated", q6_k_matvec_kernel, gated, {**u8, "sc_ptr": "*i8", **up})
        )
    return (
        out
        + rows_variants()
        + q6k_rows_variants()
        + matmul_variants()
        + norm_variants()
        + attention_variants()
        + kv_variants()
    )


def rows_variants() -> list[tuple[str, object, dict[str, Any], dict[str, str]]]:
    """Q4_K's "rows" layout: the planar kernels reading it through `row_at` (fp32 and int8 x at 3
    rows, the dequantization; the matmul is in `matmul_variants`), and the row-interleaved int8 matvec
    (a warp per 32 rows: NUM_WARPS, which `main` passes as the launch option) at one super-block a
    step as `rows_config` launches it: split and not, masked and not, with bias,
    under PDL, and on half and quarter super-blocks a lane (`RowsConfig.subs`), and preloaded. `main`
    fails the latter if its loop has a barrier (`NO_BARRIERS`)."""
    from strata.kernels._matvec_q4k_int8 import q4_k_int8_matvec_kernel
    from strata.kernels._matvec_q4k_planar import q4_k_planar_matvec_kernel
    from strata.kernels._matvec_q4k_rows import q4_k_rows_int8_matvec_kernel
    from strata.kernels.dequant_packed import _dequant_kernel

    tile = dict(M=3, M_PAD=4, BLOCK_N=16, BLOCK_K=512, SPLIT_K=2, HAS_BIAS=True, ROWS=64)
    planar, int8 = dict(tile, PREFETCH=True), dict(tile, USE_ASM=True, ROWS_AT_ONCE=False)
    deq = dict(QTYPE=113, BLOCK_N=32, BLOCK_K=256, ROUND_BF16=False, GATHER=True)
    out: list[tuple[str, object, dict[str, Any], dict[str, str]]] = [
        ("Q4_K planar, rows layout, M=3", q4_k_planar_matvec_kernel, planar, {"qs_ptr": "*i32"}),
        ("Q4_K int8, rows layout, M=3", q4_k_int8_matvec_kernel, int8, {}),
        (
            "dequant, rows layout",
            _dequant_kernel,
            deq,
            {"out_ptr": "*bf16", "p0_ptr": "*i32", "p3_ptr": "*fp16"},
        ),
    ]
    pointers = {"scm_ptr": "*u8", "dm_ptr": "*i32"}
    for rows, split, even, ahead, m, subs in (
        (128, 1, True, False, 1, 8),
        (64, 2, True, True, 1, 8),
        (32, 4, False, True, 1, 8),
        (64, 2, True, True, 4, 8),
        (64, 4, True, False, 1, 4),
        (64, 8, False, False, 1, 2),
    ):
        consts = dict(R=rows, NB=1, SPLIT_K=split, HAS_BIAS=split > 1, USE_ASM=True, EVEN=even, PDL=True)
        consts |= dict(PREFETCH=ahead, NUM_WARPS=rows // 32, M=m, M_PAD=m, SUBS=subs)
        name = f"{NO_BARRIERS[0]} R={rows} split={split} even={even} prefetch={ahead} M={m} subs={subs}"
        out.append((name, q4_k_rows_int8_matvec_kernel, consts, pointers))
        if not ahead and m == 1:  # RowsConfig.preload: main() checks a weight load precedes the wait
            preload = dict(consts, PRELOAD=True)
            out.append((f"{name} preload", q4_k_rows_int8_matvec_kernel, preload, pointers))
    return out


def attention_variants() -> list[tuple[str, object, dict[str, Any], dict[str, str]]]:
    """Paged decode attention at the 0.5B's heads (14 query heads over 2 KV heads of 64): the split
    kernel with one split and with partials, with a window, with the rotary embedding, and the merge
    of up to 64 splits and of more."""
    from strata.kernels._paged_attention_merge import _merge_kernel
    from strata.kernels.paged_attention import _split_kernel

    floats = {f"part_{n}_ptr": "*fp32" for n in ("m", "l", "acc")}
    pointers = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "out_ptr": "*bf16", **floats}
    pointers["qk_scale"] = "fp32"  # the one float among the scalar arguments
    heads = dict(NUM_HEADS=14, D=64, D_PAD=64, PDL=True)
    split = dict(heads, G=7, G_PAD=16, BLOCK_T=64, PRECISION=None, DOT_F32=False)
    out: list[tuple[str, object, dict[str, Any], dict[str, str]]] = []
    for one, window in ((True, False), (False, False), (False, True)):
        consts = dict(split, ONE_SPLIT=one, HAS_WINDOW=window)
        out.append((f"attention split one_split={one} window={window}", _split_kernel, consts, pointers))
    # PREFETCH_KV under PDL 2: main() checks the L2 prefetches precede the wait.
    consts = dict(split, ONE_SPLIT=False, HAS_WINDOW=True, PREFETCH_KV=True, PDL=2)
    out.append(("attention split prefetch_kv", _split_kernel, consts, pointers))
    # PREFETCH_KV 2: main() checks the first tile's K/V loads precede the wait.
    consts = dict(split, ONE_SPLIT=False, HAS_WINDOW=False, PREFETCH_KV=2)
    out.append(("attention split prefetch_kv=tile", _split_kernel, consts, pointers))
    out.append(("attention merge", _merge_kernel, dict(heads, S_PAD=64, HAS_WINDOW=True), pointers))
    out.append(
        ("attention merge in chunks", _merge_kernel, dict(heads, S_PAD=256, HAS_WINDOW=True), pointers)
    )
    # The o projection's int8 x made in the merge (STRATA_QUANT_IN_MERGE), the 7B's heads, both orders.
    quant = {**pointers, "xq_ptr": "*i32", "xd_ptr": "*fp32", "xs_ptr": "*fp32"}
    for planar in (True, False):
        consts = dict(heads, NUM_HEADS=28, D=128, D_PAD=128, S_PAD=64, HAS_WINDOW=False, QUANT=True)
        consts.update(PLANAR=planar, USE_ASM=True)
        out.append((f"attention merge quant planar={planar}", _merge_kernel, consts, quant))
    return out


def norm_variants() -> list[tuple[str, object, dict[str, Any], dict[str, str]]]:
    """The RMSNorm with its int8 outputs (`rms_norm_int8`) at the 0.5B's and the 7B's widths."""
    from strata.kernels.rms_norm_int8 import _rms_norm_int8_kernel

    floats = {f"{n}_ptr": "*fp32" for n in ("w", "dp", "sp", "de", "se")}
    pointers = {"r_ptr": "*bf16", "new_r_ptr": "*bf16", **floats}
    consts = dict(NSB=32, HAS_RESIDUAL=True, INT8=3, USE_ASM=True, PDL=True)
    return [
        (f"rms_norm_int8 block={block}", _rms_norm_int8_kernel, dict(consts, BLOCK=block), pointers)
        for block in (1024, 4096)
    ]


def q6k_rows_variants() -> list[tuple[str, object, dict[str, Any], dict[str, str]]]:
    """Q6_K's rows kernel (`_matvec_q6k_rows`), split and not, with prefetch and without, one x row and
    four, preloaded at one; in NO_BARRIERS."""
    from strata.kernels._matvec_q6k_rows import q6_k_rows_int8_matvec_kernel

    pointers = {"ql_ptr": "*i32", "qh_ptr": "*i32", "sc_ptr": "*i8", "d_ptr": "*fp16"}
    out: list[tuple[str, object, dict[str, Any], dict[str, str]]] = []
    for rows, split, ahead, m in ((64, 1, True, 1), (64, 32, False, 1), (64, 8, False, 4)):
        consts = dict(R=rows, SPLIT_K=split, HAS_BIAS=False, USE_ASM=True, PREFETCH=ahead, PDL=True, M=m,
                      M_PAD=m)  # fmt: skip
        name = f"{NO_BARRIERS[1]} R={rows} split={split} prefetch={ahead} M={m}"
        out.append((name, q6_k_rows_int8_matvec_kernel, dict(consts, NUM_WARPS=rows // 32), pointers))
        if m == 1:  # Q6KRowsConfig.preload: main() checks a weight load precedes the wait
            preload = dict(consts, NUM_WARPS=rows // 32, PRELOAD=True)
            out.append((f"{name} preload", q6_k_rows_int8_matvec_kernel, preload, pointers))
    return out


def matmul_variants() -> list[tuple[str, object, dict[str, Any], dict[str, str]]]:
    """The fused matmul at default_config's tiles for 16 rows (the 7B's gate+up swapped, down, and a
    narrow weight split over K), for Q4_K planar (112), Q4_K in the "rows" layout (113) and Q6_K."""
    from strata.kernels._matmul_quant import quant_matmul_kernel

    out: list[tuple[str, object, dict[str, Any], dict[str, str]]] = []
    base = dict(GROUP_M=8, EVEN_K=True, BF16_AS_F32=False, PRECISION=None)
    pointers = {"y_ptr": "*bf16", "ws_ptr": "*fp32", "p1_ptr": "*u8", "p2_ptr": "*u8", "p3_ptr": "*fp16"}
    for qtype, p0, p2 in ((112, "*i32", "*u8"), (113, "*i32", "*u8"), (14, "*u8", "*i8")):
        for bn, bk, swap, split in ((64, 64, True, 1), (16, 256, False, 1), (16, 128, False, 4)):
            tile = dict(base, QTYPE=qtype, BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, SWAP_AB=swap, SPLIT_K=split)
            name = f"matmul {qtype} 16x{bn}x{bk} swap={swap} split={split}"
            out.append((name, quant_matmul_kernel, tile, {**pointers, "p0_ptr": p0, "p2_ptr": p2}))
    return out


def compile_for_sm90(
    fn: Any, constexprs: dict[str, Any], pointers: dict[str, str], num_warps: int = 4
) -> Any:
    """The compiled kernel (its `.asm` holds ttgir, ptx, cubin). Every run-time argument is taken as a
    multiple of 16, as Triton specializes a launch on the model shapes (strides of whole blocks), so
    the layouts and vector widths are those of such a launch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    # Constexpr parameters left out take their defaults, as a launch that omits them does; so do
    # pointers defaulting to None (a launch specializes a None argument as a constexpr None, which
    # some code compiles differently from a pointer: a tuple holding it inside a loop did not).
    defaults = {
        p.name: p.default
        for p in fn.params
        if p.has_default and (p.is_constexpr or (p.default is None and p.name not in pointers))
    }
    constexprs = {**defaults, **constexprs}
    types = {**POINTERS, **pointers}
    signature = {
        n: "constexpr" if n in constexprs else types.get(n, "*i32" if n.endswith("_ptr") else "i32")
        for n in names
    }
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n not in constexprs}
    src = ASTSource(
        fn, signature, constexprs={(names.index(n),): v for n, v in constexprs.items()}, attrs=attrs
    )
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def converts_in_loops(ttgir: str) -> int:
    """Layout conversions inside loop bodies: each one of a tensor moves it through shared memory (or
    shuffles it) on every iteration, traffic that Nsight Compute counts against L1."""
    depth, count = 0, 0
    for line in ttgir.splitlines():
        depth += "scf.for" in line
        count += depth > 0 and "ttg.convert_layout" in line
        depth -= "scf.yield" in line and depth > 0
    return count


def check_pdl(ptx: str, level: int, preload: bool = False) -> None:
    """PDL 1 or 2: the PTX waits for the previous kernel; 2: it asks L2 for weights before that wait;
    `preload` (`preloads`): it loads from global memory before that wait."""
    wait = ptx.find("griddepcontrol.wait")
    if level and wait < 0:
        raise AssertionError(f"PDL={level} but the PTX has no griddepcontrol.wait")
    if level == 2 and not 0 <= ptx.find("prefetch.global.L2") < wait:
        raise AssertionError("PDL=2 but the PTX has no prefetch.global.L2 before its wait")
    if preload and not 0 <= ptx.find("ld.global") < wait:
        raise AssertionError("PRELOAD but the PTX has no global load before its wait")


def preloads(constexprs: dict[str, Any]) -> bool:
    """Whether a variant loads from global memory before its wait: a preloaded matvec (its weights)
    or an attention split with PREFETCH_KV 2 (its first K/V tile)."""
    return bool(constexprs.get("PRELOAD", False)) or constexprs.get("PREFETCH_KV") == 2


def compile_variant(fn: Any, constexprs: dict[str, Any], pointers: dict[str, str]) -> Any:
    """A variant of `variants()` compiled as main() does: NUM_WARPS among its constexprs is the
    launch's warp count, not a kernel parameter."""
    consts = {k: v for k, v in constexprs.items() if k != "NUM_WARPS"}
    return compile_for_sm90(fn, consts, pointers, constexprs.get("NUM_WARPS", 4))


# Variants whose name starts so (or holds "lane blocks") must compile without a barrier in a loop (the
# row-interleaved matvecs and the whole-block lanes were written for that, in both Triton versions they
# met: 3.6 and 3.9).
NO_BARRIERS = ("Q4_K rows int8", "Q6_K rows int8")


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter's jit functions cannot be compiled", file=sys.stderr)
        return 2
    import triton

    print(f"triton {triton.__version__}", flush=True)  # the tests check which Triton compiled
    failed = 0
    for name, fn, constexprs, pointers in variants():
        try:
            kernel = compile_variant(fn, constexprs, pointers)
            check_pdl(kernel.asm["ptx"], constexprs.get("PDL", 0), preloads(constexprs))
            converts, bars = converts_in_loops(kernel.asm["ttgir"]), barriers_in_loops(kernel.asm["cubin"])
            if constexprs.get("PRELOAD") and name.startswith(("q8_0_matvec_kernel", "q5_0_matvec_kernel")):
                late = decodes_after_wait(kernel.asm["cubin"])
                if late:
                    raise AssertionError(f"PRELOAD but {late} weight decodes after the wait")
            if (name.startswith(NO_BARRIERS) or "lane blocks" in name) and bars:
                raise AssertionError(f"{bars} barriers in its loop, where it was written to have none")
            print(
                f"ok {name} (layout conversions in loops: {converts}, barriers in loops: {bars})", flush=True
            )
        except Exception as e:  # noqa: BLE001 - each failure is reported, then the next variant runs
            failed += 1
            print(f"FAILED {name}: {type(e).__name__}: {str(e)[-600:]}", flush=True)
            traceback.print_exc(limit=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
