"""Fused RMSNorm (+ residual add), rotary + KV-cache write and gated activations against the torch code
they replace: strata.layers.norm.RMSNorm, strata.layers.rotary.RotaryEmbedding followed by
strata.engine.kv_cache.KVCache.write, and F.silu / F.gelu(approximate="tanh") in fp32.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before triton is
imported) at small sizes; with CUDA the same tests run compiled. Inputs are views into wider buffers
(fused QKV / gate-up outputs, rows with spare columns) so strides and masks are exercised; outputs
and caches are poisoned with NaN first, every element meant to be written is checked, and the spare
columns and unwritten cache slots must still hold NaN afterwards.

Tolerance (`assert_close`): |got - want| <= rtol * |want| + 1e-6 * max|want|. fp32: rtol 1e-5: the
kernels sum in another order, use the GPU's approximate rsqrt/exp, contract a*b - c*d into an FMA,
and tl.cos/tl.sin (numpy's in the interpreter, CUDA's on the GPU) may differ from torch's by an
ulp; the absolute term covers values near zero where such differences are large relative to the
value (x1*cos - x2*sin cancelling, and torch's own 0.5*x*(1 + tanh) cancelling for x << 0, which the
kernel computes as x * sigmoid(2z) instead). fp16/bf16: rtol = eps(dtype), one unit in the last
place: both sides are the same fp32 value up to such small errors, rounded once, so they may land on
neighbouring values. Results that are pure rounding (the residual sum, V, unrotated channels) must
match exactly, except bf16 under the interpreter, which converts fp32 to bf16 by truncation instead
of round-to-nearest-even and so may be one ulp low. (The interpreter also holds bf16 as raw uint16,
so bf16 arithmetic there would be wrong; the kernels convert every load to fp32 first, which they
want for accuracy anyway.) On Triton 3.6 / H200, tl.cos and tl.sin compile to CUDA's libdevice
functions (no sin.approx): over angles up to 40,000 rad their largest error equalled torch's.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Literal

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from strata.engine.kv_cache import KVCache  # noqa: E402
from strata.kernels.activation import gelu_tanh_mul, silu_mul  # noqa: E402
from strata.kernels.rms_norm import rms_norm  # noqa: E402
from strata.kernels.rotary_kv import rotary_kv_write  # noqa: E402
from strata.layers.norm import RMSNorm  # noqa: E402
from strata.layers.rotary import RotaryEmbedding  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1, 896), (5, 72), (17, 3)]  # (rows, width): Qwen2.5-0.5B's hidden size, odd small widths
NAN = float("nan")


def rtol_of(*dtypes: torch.dtype) -> float:
    return max(1e-5 if d == torch.float32 else torch.finfo(d).eps for d in dtypes)


def assert_close(got: torch.Tensor, want: torch.Tensor, rtol: float, what: str) -> None:
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    assert got.shape == want.shape, what
    if not got.numel():
        return
    assert torch.isfinite(got).all(), f"{what}: NaN/Inf where every element should have been written"
    excess = (got - want).abs() - rtol * want.abs()
    atol = 1e-6 * want.abs().max().item()
    worst = excess.argmax()
    assert excess.max().item() <= atol, (
        f"{what}: {got.flatten()[worst].item()} vs {want.flatten()[worst].item()} at flat index "
        f"{worst.item()} (rtol {rtol:.3g}, atol {atol:.3g})"
    )


def assert_rounding_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Exact, but for bf16 under the interpreter (it truncates fp32 -> bf16) one ulp."""
    if INTERPRETED and got.dtype == torch.bfloat16:
        assert_close(got, want, rtol_of(torch.bfloat16), what)
    else:
        assert torch.equal(got.cpu(), want.cpu()), f"{what}: not bit-identical"


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0, dtype: torch.dtype = torch.float32):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def in_wider(t: torch.Tensor, spare: int = 3, fill: float = NAN) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view): `t` copied into the first columns of a (rows, width + spare) buffer whose spare
    columns hold `fill`, so the view's row stride is not its width. Moved to DEVICE."""
    buf = torch.full((t.shape[0], t.shape[1] + spare), fill, dtype=t.dtype)
    buf[:, : t.shape[1]] = t
    buf = buf.to(DEVICE)
    return buf, buf[:, : t.shape[1]]


def spare_is_nan(buf: torch.Tensor, width: int) -> bool:
    return bool(torch.isnan(buf[:, width:]).all())


# --- RMSNorm ---------------------------------------------------------------------------------------


def rms_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # The layer's own torch forward (fused=False), without loading a GGUF to build the module.
    return RMSNorm.forward(SimpleNamespace(weight=weight, eps=eps, fused=False), x)  # type: ignore[arg-type]


def check_rms_norm(rows: int, hidden: int, dtype: torch.dtype, fused: bool, block: int | None) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + hidden)
    eps = 1e-6
    x = randn(gen, rows, hidden, scale=3.0, dtype=dtype)
    res0 = randn(gen, rows, hidden, dtype=dtype)
    weight = randn(gen, hidden, scale=0.1) + 1.0
    _, x_dev = in_wider(x)
    out_buf, out = in_wider(torch.full_like(x, NAN))
    res_buf, res = in_wider(res0)

    got = rms_norm(x_dev, weight.to(DEVICE), eps, residual=res if fused else None, out=out, block=block)
    assert got is out
    assert spare_is_nan(out_buf, hidden), "rms_norm wrote past the row"
    if fused:
        assert spare_is_nan(res_buf, hidden), "rms_norm wrote past the residual row"
        assert_rounding_equal(res, res0 + x, f"residual += x ({dtype})")
        # Judged against the norm of the residual the kernel left, so the check above alone covers
        # its rounding.
        want = rms_reference(res.cpu(), weight, eps)
    else:
        assert torch.equal(res.cpu(), res0), "residual changed without being passed"
        want = rms_reference(x, weight, eps)
    assert_close(got, want, rtol_of(dtype), f"rms_norm {rows}x{hidden} {dtype} fused={fused} block={block}")


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,hidden", SHAPES)
def test_rms_norm(rows, hidden, dtype, fused):
    check_rms_norm(rows, hidden, dtype, fused, block=None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,hidden,block", [(5, 72, 16), (2, 896, 128), (3, 3, 2)])
def test_rms_norm_rows_wider_than_a_tile(rows, hidden, block, dtype):
    # The two-pass loop that rows over 8192 take, at small sizes: a partial last tile, and none.
    check_rms_norm(rows, hidden, dtype, False, block)
    check_rms_norm(rows, hidden, dtype, True, block)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_qk_heads_in_place(dtype):
    # Qwen3/Gemma3 QK-norm: one norm per head of q, read and written through the (tokens, heads,
    # head_dim) view of a fused QKV output; k and v must stay untouched.
    gen = torch.Generator().manual_seed(7)
    tokens, heads, kv_heads, head_dim = 5, 7, 1, 24
    qkv = randn(gen, tokens, (heads + 2 * kv_heads) * head_dim, scale=2.0, dtype=dtype).to(DEVICE)
    before = qkv.clone()
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    weight = randn(gen, head_dim, scale=0.1) + 1.0
    want = rms_reference(q.cpu(), weight, 1e-6)
    assert rms_norm(q, weight.to(DEVICE), 1e-6, out=q) is q
    assert_close(q, want, rtol_of(dtype), f"QK-norm {dtype}")
    assert torch.equal(qkv[:, heads * head_dim :], before[:, heads * head_dim :]), "k/v columns changed"


# --- Rotary + KV-cache write -----------------------------------------------------------------------


def check_rotary(
    tokens: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    rope_dim: int,
    layout: Literal["neox", "interleaved"],
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    scale: float = 1.0,
    pad_tokens: tuple[int, ...] = (),
) -> None:
    gen = torch.Generator().manual_seed(tokens * 100 + heads + rope_dim)
    rope = RotaryEmbedding(rope_dim, 10000.0, layout, scale)
    # A fused QKV output; q, k, v are strided views of it.
    qkv = randn(gen, tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))
    # Positions up to 40,000: angles far outside [-pi, pi] test the cos/sin argument reduction.
    positions = torch.randint(0, 40_000, (tokens,), generator=gen)
    positions[0] = 0
    num_slots = tokens + 5  # spare slots stay NaN
    slots = torch.randperm(num_slots, generator=gen)[:tokens]
    slots[list(pad_tokens)] = -1
    kept = slots >= 0

    want_q = rope(q, positions)
    want_cache = KVCache(2, num_slots, kv_heads, head_dim, cache_dtype)
    want_cache.kv.fill_(NAN)
    want_cache.write(1, slots[kept], rope(k, positions)[kept], v[kept])

    qkv_dev = qkv.to(DEVICE)
    sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    q_dev, k_dev, v_dev = (t.view(tokens, -1, head_dim) for t in qkv_dev.split(sizes, dim=1))
    cache = KVCache(2, num_slots, kv_heads, head_dim, cache_dtype)
    cache.kv = torch.full_like(cache.kv, NAN, device=DEVICE)
    rotary_kv_write(
        q_dev, k_dev, v_dev, positions.to(DEVICE), rope.inv_freq.to(DEVICE), cache.kv[1, 0], cache.kv[1, 1],
        slots.to(DEVICE), rope_dim=rope_dim, layout=layout, scale=scale,
    )  # fmt: skip

    what = f"{layout} rope_dim {rope_dim}/{head_dim} {dtype} -> cache {cache_dtype}"
    assert_close(q_dev[..., :rope_dim], want_q[..., :rope_dim], rtol_of(dtype), f"q {what}")
    assert torch.equal(q_dev[..., rope_dim:].cpu(), q[..., rope_dim:]), f"q's unrotated channels {what}"
    assert torch.equal(qkv_dev[:, heads * head_dim :].cpu(), qkv[:, heads * head_dim :]), (
        f"k/v changed {what}"
    )
    got_kv, want_kv = cache.kv.cpu(), want_cache.kv
    assert torch.equal(got_kv.isnan(), want_kv.isnan()), f"cache slots written: {what}"
    got_k, want_k = got_kv[1, 0][slots[kept]], want_kv[1, 0][slots[kept]]
    got_v, want_v = got_kv[1, 1][slots[kept]], want_kv[1, 1][slots[kept]]
    assert_rounding_equal(got_v, want_v, f"V cache {what}")
    assert_close(
        got_k[..., :rope_dim], want_k[..., :rope_dim], rtol_of(dtype, cache_dtype), f"K cache {what}"
    )
    assert_rounding_equal(
        got_k[..., rope_dim:], want_k[..., rope_dim:], f"K cache's unrotated channels {what}"
    )


@pytest.mark.parametrize("rope_dim", [24, 16], ids=["full", "partial"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["neox", "interleaved"])
def test_rotary_kv_write(layout, dtype, rope_dim):
    # GQA with 7 query heads per KV head; head_dim 24 pads to 32, half of rope_dim 16 is 8.
    check_rotary(5, 7, 1, 24, rope_dim, layout, dtype, cache_dtype=dtype)


@pytest.mark.parametrize("layout", ["neox", "interleaved"])
def test_rotary_kv_write_cache_dtype_scale_and_padding(layout):
    # Qwen2.5's 14 over 2 heads, a cache dtype other than the activations', linear scaling, tokens
    # whose slot is -1 (a captured batch's padding) leaving the cache alone; one token, then 17.
    check_rotary(1, 14, 2, 64, 32, layout, torch.bfloat16, cache_dtype=torch.float16, scale=4.0)
    check_rotary(17, 14, 2, 64, 64, layout, torch.float32, torch.bfloat16, pad_tokens=(3, 16))
    check_rotary(17, 14, 2, 64, 48, layout, torch.float16, torch.float32, scale=0.5)


# --- Gated activations -----------------------------------------------------------------------------

ACTIVATIONS = {
    "silu": (silu_mul, F.silu),
    "gelu_tanh": (gelu_tanh_mul, lambda g: F.gelu(g, approximate="tanh")),
}


# exp(-2z) overflowing to inf for gate << 0 is intended (the sigmoid goes to 0); numpy warns about it.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,width", [(1, 2100), (5, 72), (17, 3)])  # 2100: three column tiles
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_gated_activation(name, rows, width, dtype):
    kernel, act = ACTIVATIONS[name]
    gen = torch.Generator().manual_seed(rows * 10_000 + width)
    # Scale 4 reaches both tails: g << 0, where exp(-g) overflows to inf, and g >> 0.
    gate_up = randn(gen, rows, 2 * width, scale=4.0, dtype=dtype)
    gate, up = gate_up[:, :width], gate_up[:, width:]
    want = (act(gate.float()) * up.float()).to(dtype)
    gate_up_dev = gate_up.to(DEVICE)
    out_buf, out = in_wider(torch.full((rows, width), NAN, dtype=dtype))
    got = kernel(gate_up_dev[:, :width], gate_up_dev[:, width:], out=out)
    assert got is out
    assert spare_is_nan(out_buf, width), f"{name} wrote past the row"
    assert_close(got, want, rtol_of(dtype), f"{name}_mul {rows}x{width} {dtype}")
    assert torch.equal(gate_up_dev.cpu(), gate_up), "inputs changed"
    # Allocating its own output gives the same values.
    assert torch.equal(kernel(gate_up_dev[:, :width], gate_up_dev[:, width:]), got)


# --- Argument checks -------------------------------------------------------------------------------


def test_errors_name_the_problem():
    x = torch.zeros(2, 8, device=DEVICE)
    w = torch.ones(8, device=DEVICE)
    with pytest.raises(ValueError, match=r"weight must be a contiguous \(8,\)"):
        rms_norm(x, w[:4], 1e-6)
    with pytest.raises(TypeError, match="residual must have x's dtype"):
        rms_norm(x, w, 1e-6, residual=x.half())
    with pytest.raises(TypeError, match="x must be fp32, fp16 or bf16"):
        rms_norm(x.double(), w, 1e-6)
    with pytest.raises(ValueError, match="block must be a power of two"):
        rms_norm(x, w, 1e-6, block=24)

    q, kv = torch.zeros(3, 4, 16, device=DEVICE), torch.zeros(3, 2, 16, device=DEVICE)
    cache = torch.zeros(10, 2, 16, device=DEVICE)
    pos = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    inv_freq = torch.ones(8, device=DEVICE)
    args = (q, kv, kv, pos, inv_freq, cache, cache, pos)
    with pytest.raises(ValueError, match="rope_dim must be even"):
        rotary_kv_write(*args, rope_dim=15, layout="neox")
    with pytest.raises(ValueError, match=r"inv_freq must be \(4\)"):
        rotary_kv_write(*args, rope_dim=8, layout="neox")
    with pytest.raises(ValueError, match="layout must be"):
        rotary_kv_write(*args, rope_dim=16, layout="gptj")
    with pytest.raises(TypeError, match="slot_mapping must be one of"):
        rotary_kv_write(*args[:7], pos.float(), rope_dim=16, layout="neox")
    with pytest.raises(ValueError, match=r"v_cache must be \(10, 2, 16\)"):
        rotary_kv_write(*args[:6], cache[:, :1], pos, rope_dim=16, layout="neox")

    with pytest.raises(ValueError, match="up must be"):
        silu_mul(x, x[:, :4])
    with pytest.raises(TypeError, match="out must have gate's dtype"):
        gelu_tanh_mul(x, x, out=x.half())
