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

from strata import env
from strata.kernels.quant_pack import PackedQuantWeight

_T = GGMLQuantizationType
_FP32_X = {
    _T.Q8_0: "q8_0_matvec_kernel", _T.Q5_0: "q5_0_matvec_kernel", _T.Q4_0: "q4_0_matvec_kernel",
    _T.Q4_K: "q4_k_matvec_kernel", _T.Q6_K: "q6_k_matvec_kernel", _T.Q2_K: "q2_k_matvec_kernel",
    _T.IQ4_XS: "iq4_xs_matvec_kernel", _T.IQ2_XS: "iq2_xs_matvec_kernel", _T.IQ2_S: "iq2_s_matvec_kernel",
}  # fmt: skip
_INT8_X = {
    _T.Q4_K: "q4_k_int8_matvec_kernel", _T.Q6_K: "q6_k_int8_matvec_kernel",
    _T.Q8_0: "legacy_int8_matvec_kernel", _T.Q5_0: "legacy_int8_matvec_kernel",
}  # fmt: skip
_ROWS = {_T.Q4_K: "q4_k_rows_int8_matvec_kernel", _T.Q6_K: "q6_k_rows_int8_matvec_kernel"}


def matvec_kernel(w: PackedQuantWeight, int8_types: frozenset[str]) -> str:
    """The name of the kernel that multiplies one row of 16-bit x by `w` (`int8_types`: STRATA_INT8_X's)."""
    if w.layout == "rows":
        return _ROWS[w.qtype]
    int8 = w.qtype.name in int8_types and w.qtype in _INT8_X and (w.qtype != _T.Q4_K or w.planar)
    if int8:
        return _INT8_X[w.qtype]
    return "q4_k_planar_matvec_kernel" if w.planar else _FP32_X[w.qtype]


def bytes_by_kernel(weights: Iterable[PackedQuantWeight]) -> dict[str, int]:
    """Bytes a step reads with each kernel: every distinct weight once (a tied head shares the
    embedding's planes, which the lookup reads only a row of)."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    int8_types = env.int8_x_types()
    for w in weights:
        if w.planes[0].data_ptr() in seen:
            continue
        seen.add(w.planes[0].data_ptr())
        name = matvec_kernel(w, int8_types)
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
