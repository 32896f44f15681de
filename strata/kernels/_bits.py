"""Bit helpers shared by the Triton kernels."""

import triton
import triton.language as tl

from strata.kernels.kv_in_matvec import store_kv


@triton.jit
def exact_float(u, BIAS: tl.constexpr):
    """float32(u) - BIAS for int32 0 <= u < 2**23, without an int-to-float conversion.

    ORing u into the mantissa of 2**23 gives the float 2**23 + u exactly; one subtraction removes
    2**23 and the bias. This costs two full-rate ALU ops, where I2F runs at a quarter rate on sm_90
    and would cap a 4-bit matvec below HBM bandwidth.
    """
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + BIAS)


@triton.jit
def fp16_halves(pair):
    """The two fp16 values side by side in each int32 word of `pair` (the low half first): Q4_K's d
    and dmin loaded as one word."""
    low = (pair & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
    high = ((pair >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
    return low, high


@triton.jit
def row_at(r, c, stride, R: tl.constexpr, U: tl.constexpr, W: tl.constexpr):
    """The offset of column c of row r in a planar plane (row stride `stride`): r * stride + c; or, with
    R rows per group (quant_pack's "rows" layout, `stride` then a group's), in the plane regrouped so
    that each run of U columns of a group's R rows lies side by side in records of W >= U elements."""
    if R == 0:  # noqa: SIM108 (one branch compiled, by the constexpr)
        at = r * stride + c
    else:
        at = (r // R) * stride + (c // U) * (W * R) + (r % R) * W + c % U
    return at


@triton.jit
def split_range(num_units, UNITS: tl.constexpr, SPLIT_K: tl.constexpr):
    """[lo, hi) of the K units (blocks, chunks) this program's split covers; lo is a multiple of UNITS.
    Unsplit, the whole row without arithmetic (every launch's grid has SPLIT_K programs along axis 1):
    about ten instructions fewer in each program's prologue."""
    if SPLIT_K == 1:
        return 0, num_units
    per_split = tl.cdiv(tl.cdiv(num_units, SPLIT_K), UNITS) * UNITS
    lo = tl.program_id(1) * per_split
    return lo, tl.minimum(lo + per_split, num_units)


@triton.jit
def add_to_row(acc, part, m: tl.constexpr, M_PAD: tl.constexpr):
    """acc[m, :] += part for an (M_PAD, BLOCK_N) accumulator and a (BLOCK_N,) partial sum."""
    if M_PAD == 1:
        out = acc + part[None, :]
    else:
        out = acc + tl.where(tl.arange(0, M_PAD)[:, None] == m, part[None, :], 0.0)
    return out


@triton.jit
def add_to_row3(acc, part, m: tl.constexpr, M_PAD: tl.constexpr):
    """acc[m, :, :] += part for an (M_PAD, BLOCK_N, NS) accumulator and a (BLOCK_N, NS) partial sum."""
    if M_PAD == 1:
        out = acc + part[None, :, :]
    else:
        out = acc + tl.where(tl.arange(0, M_PAD)[:, None, None] == m, part[None, :, :], 0.0)
    return out


@triton.jit
def store_rows(
    y_ptr,
    out_ptr,
    lock_ptr,
    acc,
    rows,
    N,
    stride_ys,
    stride_ym,
    M: tl.constexpr,
    M_PAD: tl.constexpr,
    b_ptr,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    kv=None,
    KV_Q: tl.constexpr = 0,
    KV_K: tl.constexpr = 0,
    HEAD_DIM: tl.constexpr = 0,
    INTERLEAVED: tl.constexpr = False,
    BLOCK_N: tl.constexpr = 1,
):
    """Write the (M_PAD, BLOCK_N) accumulator, plus the bias b[rows] when there is one, to out[m, rows]
    (row stride stride_ym), rounding once to out's dtype. HEAD_DIM > 0: the store of
    `kv_in_matvec.store_kv` (the rotary embedding and the K/V write), `kv` and the constants after it
    its arguments.

    Under split-K the partials go through the workspace y[split, m, rows] (split stride stride_ys,
    row stride stride_ym) and `sum_splits`, per row tile."""
    mi = tl.arange(0, M_PAD)
    inside = (mi[:, None] < M) & (rows[None, :] < N)
    at = mi[:, None] * stride_ym + rows[None, :]
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(b_ptr + rows, mask=rows < N, other=0).to(tl.float32)[None, :]
    if SPLIT_K == 1:
        _store(
            out_ptr, at, inside, acc + bias, rows, kv, M, M_PAD, BLOCK_N, KV_Q, KV_K, HEAD_DIM, INTERLEAVED
        )
    else:
        sum_splits(
            y_ptr, out_ptr, lock_ptr, acc, at, at, inside, tl.program_id(0), stride_ys, bias, SPLIT_K, rows,
            kv, M, M_PAD, BLOCK_N, KV_Q, KV_K, HEAD_DIM, INTERLEAVED,
        )  # fmt: skip


@triton.jit
def _store(out_ptr, at, inside, value, rows, kv, M: tl.constexpr, M_PAD: tl.constexpr,
           BLOCK_N: tl.constexpr, KV_Q: tl.constexpr, KV_K: tl.constexpr, HEAD_DIM: tl.constexpr,
           INTERLEAVED: tl.constexpr):  # fmt: skip
    """out[at] = `value` rounded to out's dtype, or under the K/V write (HEAD_DIM > 0) `store_kv`'s
    store."""
    if HEAD_DIM > 0:
        store_kv(out_ptr, at, inside, value, rows, kv, M, M_PAD, BLOCK_N, KV_Q, KV_K, HEAD_DIM, INTERLEAVED)
    else:
        tl.store(out_ptr + at, value.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def sum_splits(
    y_ptr, out_ptr, lock_ptr, acc, at_ws, at_out, inside, tile, stride_ys, bias, SPLIT_K: tl.constexpr,
    rows=None, kv=None, M: tl.constexpr = 1, M_PAD: tl.constexpr = 1,
    BLOCK_N: tl.constexpr = 1, KV_Q: tl.constexpr = 0, KV_K: tl.constexpr = 0, HEAD_DIM: tl.constexpr = 0,
    INTERLEAVED: tl.constexpr = False,
):  # fmt: skip
    """Split-K without a launch of its own: this split (program_id(1)) stores its fp32 partial tile to
    the workspace y[split] (offsets at_ws, split stride stride_ys), and the last split of the tile to
    finish (counted in lock[tile] by an atomic) sums the partials in split order, adds `bias`, writes
    out (offsets at_out) rounded once to its dtype and resets the counter to 0 for the next launch.
    HEAD_DIM > 0: written by `store_kv` (the arguments from `rows`).
    The barrier makes this program's partial stores precede its release (the atomic is one thread's);
    the partials are read through L2 (.cg), where the other programs' stores landed."""
    tl.store(y_ptr + tl.program_id(1) * stride_ys + at_ws, acc, mask=inside)
    tl.debug_barrier()
    if tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
        total = tl.zeros_like(acc)
        for s in tl.static_range(SPLIT_K):
            total += tl.load(y_ptr + s * stride_ys + at_ws, mask=inside, other=0, cache_modifier=".cg")
        _store(out_ptr, at_out, inside, total + bias, rows, kv, M, M_PAD, BLOCK_N, KV_Q, KV_K, HEAD_DIM,
               INTERLEAVED)  # fmt: skip
        tl.store(lock_ptr + tile, 0)
