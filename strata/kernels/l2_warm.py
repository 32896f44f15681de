"""Ask L2 for byte ranges of weights a decode step reads soon (STRATA_L2_WARM; `layers.l2_warm`).

A decode step of a small model spends most of its time in latency-bound kernels (norms, rotary,
attention, the small matvecs) during which HBM idles, and its big matvecs then wait on their loads.
Launched on a side stream of the step's graph, `warm_l2` asks L2 for the weights of the matvecs a
layer ahead with the Hopper bulk prefetch (`cp.async.bulk.prefetch.L2`, one instruction per lane for
a run of bytes), so those matvecs find them there. It writes nothing and reads nothing back: a hint,
never a change of any value.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Bytes one lane asks for (a multiple of 16, as the instruction requires) and lanes a program: a
# program covers CHUNK bytes, one table row.
LANE_BYTES = 8192
LANES = 32
CHUNK = LANE_BYTES * LANES


@triton.jit
def _warm_l2_kernel(table_ptr, LANE_BYTES: tl.constexpr, LANES: tl.constexpr):
    """Program i asks L2 for table row i's bytes: (address, length), both multiples of 16, length at
    most LANES * LANE_BYTES; lanes past the length ask for nothing."""
    row = tl.program_id(0)
    address = tl.load(table_ptr + 2 * row)
    length = tl.load(table_ptr + 2 * row + 1)
    at = tl.arange(0, LANES).to(tl.int64) * LANE_BYTES
    size = tl.minimum(tl.maximum(length - at, 0), LANE_BYTES).to(tl.int32)
    # No result: the asm's dummy output is never read, and is_pure=False keeps it.
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [address + at, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def chunk_table(ranges: list[tuple[int, int]], device: torch.device) -> torch.Tensor:
    """(rows, 2) int64 on `device`: each (address, length) range cut into runs of at most CHUNK bytes,
    its start rounded up and its end down to 16 bytes (never past the range: the instruction asks for
    whole 16-byte units, and a few edge bytes are not worth a read outside the tensor)."""
    rows: list[tuple[int, int]] = []
    for address, length in ranges:
        start, end = -(-address // 16) * 16, (address + length) // 16 * 16
        rows.extend((at, min(CHUNK, end - at)) for at in range(start, end, CHUNK))
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 2).to(device)


def warm_l2(table: torch.Tensor) -> None:
    """Ask L2 for every range of `chunk_table`'s `table` (a CUDA tensor; Hopper or later)."""
    if table.shape[0]:
        _warm_l2_kernel[(table.shape[0],)](table, LANE_BYTES=LANE_BYTES, LANES=LANES, num_warps=1)
