"""The bytes of weights each decode matvec kernel reads in a step of one sequence, for the effective
bandwidth that `gpu_engine.py --profile` reports beside each kernel's time (issue 7 asks for each
kernel's bandwidth as a fraction of the measured copy ceiling).

Every projection on the kernel path holds one `PackedQuantWeight` (stacked projections one for the
stack; a tied output head the embedding's own), which one matvec per step reads whole. Which kernel
reads it follows `quant_matvec`'s dispatch for one row of 16-bit x under the default settings: the
STRATA_INT8_X types on int8 x (Q4_K planar, Q6_K by default), the "rows" layouts by their own kernels.
"""

from __future__ import annotations

from collections.abc import Iterable

from gguf.constants import GGMLQuantizationType

from strata.kernels import int8_matvec as im
from strata.kernels import quant_matvec as qm
from strata.kernels._matvec_q4k_rows import q4_k_rows_int8_matvec_kernel
from strata.kernels._matvec_q6k_rows import q6_k_rows_int8_matvec_kernel
from strata.kernels.int8_inputs import int8_order
from strata.kernels.quant_pack import PackedQuantWeight

_T = GGMLQuantizationType
# The kernels `quant_matvec`'s branches launch beyond its table `_KERNELS`: int8 x (`int8_matvec`)
# and the "rows" layouts (`rows_matvec`).
_INT8_X = {
    _T.Q4_K: im.q4_k_int8_matvec_kernel, _T.Q6_K: im.q6_k_int8_matvec_kernel,
    _T.Q8_0: im.legacy_int8_matvec_kernel, _T.Q5_0: im.legacy_int8_matvec_kernel,
}  # fmt: skip
_ROWS = {_T.Q4_K: q4_k_rows_int8_matvec_kernel, _T.Q6_K: q6_k_rows_int8_matvec_kernel}


def matvec_kernel(w: PackedQuantWeight) -> str:
    """The name of the kernel that multiplies one row of 16-bit x by `w`, as `quant_matvec` picks it:
    int8 x where `int8_order` says so (the "rows" layouts by their own kernels), else its table."""
    if int8_order(w) is None:
        kernel = (qm._Q4_K_PLANAR if w.planar else qm._KERNELS[w.qtype])[0]
    else:
        kernel = (_ROWS if w.layout == "rows" else _INT8_X)[w.qtype]
    return kernel.fn.__name__


def bytes_by_kernel(weights: Iterable[PackedQuantWeight]) -> dict[str, int]:
    """Bytes a step reads with each kernel: every distinct weight once (a tied head shares the
    embedding's planes, which the lookup reads only a row of)."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for w in weights:
        if w.planes[0].data_ptr() in seen:
            continue
        seen.add(w.planes[0].data_ptr())
        name = matvec_kernel(w)
        out[name] = out.get(name, 0) + w.nbytes
    return out


def bandwidth_lines(us_a_step: dict[str, float], read: dict[str, int], ceiling_gbs: float) -> list[str]:
    """A line per kernel of `read`: its time and bytes a step, and bytes / time against the ceiling."""
    lines = [f"weights read a step, by kernel (copy ceiling {ceiling_gbs:,.0f} GB/s):"]
    for name, nbytes in sorted(read.items(), key=lambda kv: -kv[1]):
        us = us_a_step.get(name, 0.0)
        gbs = nbytes / us / 1e3 if us else float("nan")
        lines.append(
            f"  {name:32s} {us:8.1f} us {nbytes / 1e6:9.1f} MB {gbs:8.0f} GB/s {gbs / ceiling_gbs:6.1%}"
        )
    return lines
