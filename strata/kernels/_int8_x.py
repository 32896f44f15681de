"""x quantized to int8 for the dp4a matvecs, and dp4a itself (with its interpreter twin).

`quantize_x_kernel` writes, per row and 32-element sub-block: dx = max|x| / 127, q = round(x / dx)
in [-127, 127], the exact fp32 sum of x, and q packed four bytes to a word, eight words per sub-block:
in the order of Q4_K's planar nibbles (PLANAR, see `_matvec_q4k_int8`) or in element order (word j
holds elements 4j .. 4j + 3, byte b element 4j + b), which the byte-per-weight types read.
"""

import torch
import triton
import triton.language as tl

from strata.kernels.activation import gated_value
from strata.kernels.pdl import await_inputs

# x quantized for the int8 matvecs: int32 words of four int8, the scales dx, the fp32 sums of x.
Int8X = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def empty_int8_x(rows: int, subs: int, device: torch.device) -> Int8X:
    """Uninitialized buffers for `rows` rows of `subs` 32-element sub-blocks quantized by `store_int8`:
    the words (rows, subs * 8) int32, the scales and the sums (rows, subs) fp32."""
    xq = torch.empty(rows, subs * 8, dtype=torch.int32, device=device)
    xd = torch.empty(rows, subs, dtype=torch.float32, device=device)
    return xq, xd, torch.empty_like(xd)


@triton.jit
def quantize_x_kernel(
    x_ptr, up_ptr, xq_ptr, xd_ptr, xs_ptr, K, stride_xm, stride_um,
    NSB: tl.constexpr, PLANAR: tl.constexpr, ACT: tl.constexpr = 0,
    PDL: tl.constexpr = False, USE_ASM: tl.constexpr = False,
):  # fmt: skip
    """Program (m, j) quantizes sub-blocks j * NSB .. of row m. ACT 1 (silu) or 2 (gelu_tanh): the row
    quantized is act(x) * up, rounded to x's dtype as `strata.kernels.activation` stores it."""
    await_inputs(PDL)
    m = tl.program_id(0)
    s = tl.program_id(1) * NSB + tl.arange(0, NSB)
    sv = s < K // 32
    e = tl.arange(0, 32)
    x = tl.load(x_ptr + m * stride_xm + s[:, None] * 32 + e[None, :], mask=sv[:, None], other=0)
    if ACT != 0:
        u = tl.load(up_ptr + m * stride_um + s[:, None] * 32 + e[None, :], mask=sv[:, None], other=0)
        x = gated_value(x.to(tl.float32), u.to(tl.float32), ACT == 2).to(x_ptr.dtype.element_ty)
    n_sub = K // 32
    xq_row, xd_row, xs_row = xq_ptr + m * n_sub * 8, xd_ptr + m * n_sub, xs_ptr + m * n_sub
    store_int8(x.to(tl.float32), s, sv, xq_row, xd_row, xs_row, NSB, PLANAR, USE_ASM)


@triton.jit
def store_int8(
    x, s, sv, xq_row, xd_row, xs_row, NSB: tl.constexpr, PLANAR: tl.constexpr, USE_ASM: tl.constexpr
):
    """Quantize sub-blocks s (NSB,) of one row, x (NSB, 32) fp32, and store them where `sv`: their
    words at xq_row + 8 s, dx at xd_row + s, the sums of x at xs_row + s (the layout of `quantize_x`).
    NSB is passed, not read from x.shape (a shape built so inside a nested jit function reaches
    Triton's compiler as tensors). The same bits in any kernel, with or without FMA contraction: the
    one product that an add follows is an explicitly rounded multiply (USE_ASM; the interpreter's
    numpy never contracts)."""
    amax = tl.max(tl.abs(x), 1)
    # Correctly rounded divisions (the GPU's default fp32 `/` is approximate), so that the interpreter
    # and the GPU round every x alike; no 1 / 0, even where unused.
    inv = tl.where(
        amax > 0, tl.math.div_rn(tl.full(amax.shape, 127.0, tl.float32), tl.maximum(amax, 1e-30)), 0.0
    )
    x_b, inv_b = tl.broadcast(x, inv[:, None])
    if USE_ASM:  # mul.rn is never fused into an FMA, by LLVM or by ptxas
        v = tl.inline_asm_elementwise(
            "mul.rn.f32 $0, $1, $2;", "=f,f,f", [x_b, inv_b], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        v = x_b * inv_b
    q = (v + tl.where(v >= 0, 0.5, -0.5)).to(tl.int32)  # round half away from zero
    if PLANAR:  # element e = 8b + 4h + r goes to byte b of x word (h, r)
        b = tl.reshape(q & 255, (NSB, 4, 8)) << (8 * tl.arange(0, 4))[None, :, None]
        words = tl.sum(b, 1)  # (NSB, 8): word 4h + r; the shifted bytes do not overlap
    else:  # element e = 4j + b goes to byte b of word j
        words = tl.sum(tl.reshape(q & 255, (NSB, 8, 4)) << (8 * tl.arange(0, 4))[None, None, :], 2)
    tl.store(xq_row + s[:, None] * 8 + tl.arange(0, 8)[None, :], words, mask=sv[:, None])
    tl.store(xd_row + s, tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)), mask=sv)
    tl.store(xs_row + s, tl.sum(x, 1), mask=sv)


@triton.jit
def _dp4a(a, b, c, USE_ASM: tl.constexpr, SIGNED_A: tl.constexpr = False):
    """c + sum over the four bytes of a (unsigned, or signed with SIGNED_A) times those of b (signed)."""
    if USE_ASM and SIGNED_A:
        out = tl.inline_asm_elementwise(
            "dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32, is_pure=True, pack=1
        )
    elif USE_ASM:
        out = tl.inline_asm_elementwise(
            "dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32, is_pure=True, pack=1
        )
    else:  # Triton's interpreter runs no PTX: the same integer arithmetic, byte by byte
        out = c
        for i in tl.static_range(4):
            a_i = (a >> (8 * i)) & 255
            if SIGNED_A:
                a_i = (a_i ^ 128) - 128
            out += a_i * ((((b >> (8 * i)) & 255) ^ 128) - 128)
    return out


@triton.jit
def _x_rows(xq_ptr, xd_ptr, sub, valid, n_sub, M: tl.constexpr, M_PAD: tl.constexpr):
    """Every row's eight element-order words of sub-blocks `sub` (NS,), (M_PAD, NS, 8), and their
    scales dx, (M_PAD, NS); zero where the row or the sub-block is not `valid`."""
    mi = tl.arange(0, M_PAD)
    ok = (mi < M)[:, None] & valid[None, :]
    at = xq_ptr + mi[:, None, None] * n_sub * 8 + sub[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    x = tl.load(at, mask=ok[:, :, None], other=0)
    dx = tl.load(xd_ptr + mi[:, None] * n_sub + sub[None, :], mask=ok, other=0)
    return x, dx


@triton.jit
def _dot_rows(w, x, USE_ASM: tl.constexpr):
    """Signed dp4a of weight words w (BLOCK_N, NS, 8) with every row's x words (M_PAD, NS, 8):
    the (M_PAD, BLOCK_N, NS, 8) integer sums of four products each."""
    # tl.broadcast, not broadcast_to with a shape tuple: a tuple built from .shape inside a nested jit
    # function reaches the compiler as tensors (Triton 3.6 rejects it; the interpreter does not).
    a, b = tl.broadcast(w[None, :, :, :], x[:, None, :, :])
    return _dp4a(a, b, tl.zeros_like(a), USE_ASM, SIGNED_A=True)
