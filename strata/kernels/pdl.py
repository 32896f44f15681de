"""Programmatic dependent launch (PDL, sm_90+): the launch gap between a decode step's kernels hidden.

A decode step is a few hundred small kernels in a row, each a few microseconds; between two of them
the GPU drains one grid and launches the next. Launched with PDL, a kernel may start while the one
before it runs: its programs become resident early and wait in `await_inputs` until the previous
kernel has finished and its writes are visible. Every kernel that is launched with `launch_args`
calls `await_inputs(PDL)` (or `await_inputs_after`) before it reads or writes any memory that the
kernel before it may write, so the order of those memory effects is that of ordinary launches; only
the launch, the programs' start and the reads of what that kernel cannot have written are overlapped:
the preloaded matvecs' weights (no kernel writes them) and, under STRATA_ATTENTION_PREFETCH, decode
attention's context lengths and block tables (copied in before a graph's replay) and, at its tile
level, the K/V rows of positions before the step's new token. Those were written by earlier steps,
by kernels that had finished before the kernel just before the attention got past its own wait (a
program starts only once every program of the kernel before it has passed its wait), hence before
any of the attention's programs started.

The fused tensor-core matmul (batched decode) and the prefill attention are launched ordinarily:
with the matmul under PDL the 7B's decode of 16 sequences ran 0.933x (H200, 2026-12-04).

The kernels' `PDL` constexpr: 0 (False) an ordinary launch, 1 PDL, 2 (STRATA_PDL's default) PDL
with the fp32-x Q8_0 and Q5_0 matvecs' `prefetch_weights` before the wait: weights are never written
by a kernel, so a matvec's programs, resident while the kernel before them runs, can already pull
their first weights into L2.
The int8-x matvecs (Q4_K, Q6_K and the int8 Q8_0/Q5_0) prefetched too at first, and the 7B (all
int8 matvecs) ran 0.994x at one sequence and 0.958x at 16 (H200, 2026-12-04): they no longer do.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from strata import env

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    AVAILABLE = True
except ImportError:  # a Triton without grid dependency control: ordinary launches only
    AVAILABLE = False

    @triton.jit
    def gdc_launch_dependents():
        pass

    @triton.jit
    def gdc_wait():
        pass


@triton.jit
def await_inputs(PDL: tl.constexpr):
    """First thing in a kernel: with PDL, wait for the previous kernel, then let the next one launch.

    In this order, not the other: a kernel that let its successor launch before waiting would let
    that one's programs launch the next, and so on down the step, each kernel's programs resident and
    idle, taking the SM slots the running kernel's later programs need (the 7B's decode ran 0.90x so,
    H200, 2026-12-04)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def await_inputs_after(token, PDL: tl.constexpr):
    """`await_inputs` after `token` (an int32 tensor) is computed: for work done before the wait, such as
    a preloaded matvec's decode of its weights. ptxas moves arithmetic freely across the wait, which
    orders memory only (in the sm_90 build of the 0.5B's preloaded 8 x 1,024 Q5_0 tile, all 32 of a
    thread's decodes ran after it); a wait predicated on `token` cannot be issued before `token` is.
    The predicate compares token's bits with a signaling NaN, which no float arithmetic produces
    (sm_90 writes the canonical NaN), so it always holds; a constant predicate ptxas folds away.
    Each thread waits once per element of `token` it holds: the waits after the first return at
    once."""
    if PDL:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $1, 0x7FBADBAD; @p griddepcontrol.wait; } mov.u32 $0, 0;",
            "=r,r",
            [token],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
        gdc_launch_dependents()


@triton.jit
def prefetch_weights(plane_ptr, rows, stride, start, end, STEP: tl.constexpr, PDL: tl.constexpr):
    """With PDL 2, before `await_inputs`: ask L2 for elements [start, start + 2 STEP) of the weight
    plane's `rows` (row stride `stride`, elements of plane_ptr's type; clamped below `end`, the
    program's last element), the first two K steps of the program's loop, one request per 128-byte
    line. `rows` (BLOCK_N,) must be valid rows; STEP a power of two."""
    if PDL == 2:
        PER_LINE: tl.constexpr = 1024 // plane_ptr.dtype.element_ty.primitive_bitwidth
        LINES: tl.constexpr = (2 * STEP + PER_LINE - 1) // PER_LINE
        at = tl.maximum(tl.minimum(start + tl.arange(0, LINES) * PER_LINE, end - 1), 0)
        ptrs = plane_ptr + rows[:, None] * stride + at[None, :]
        # No result: the asm's dummy output is never read, and is_pure=False keeps it.
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
        )


def launch_args(device: torch.device) -> dict[str, bool | int]:
    """The extra arguments for launching a kernel that calls `await_inputs`: PDL at STRATA_PDL's level
    (unless 0) on a CUDA GPU of compute capability 9.0 or later while a CUDA graph is being captured:
    the decode steps, whose launch gaps it hides. Nothing otherwise, an ordinary launch: Triton's
    interpreter, older GPUs, and eager launches (prefill), where it was not measured faster."""
    level = env.pdl()
    if device.type != "cuda" or not level or not AVAILABLE or not torch.cuda.is_current_stream_capturing():
        return {}
    if not _supports_pdl(torch.cuda.current_device() if device.index is None else device.index):
        return {}
    return {"PDL": level, "launch_pdl": True}


@functools.cache
def _supports_pdl(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9
