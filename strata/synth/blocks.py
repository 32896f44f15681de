"""Random tensor data in GGUF block formats whose dequantized values have a chosen RMS.

Random bytes are valid quantized blocks except for their fp16 scale fields (a random fp16 may be
Inf/NaN or 1e4). So a chunk is made of raw generator output, then each block's scale fields are
overwritten through a strided numpy view with `d * u`, u ~ U(0.5, 1.5) (varying per block, so a
kernel that reads the wrong block's scale shows up), where d makes the RMS of the dequantized values
equal the target. K-quant minimums (`dmin`) are set in proportion to `d` so that the values have
mean zero, as real weights do.
"""

from __future__ import annotations

import math

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import IQ4_NL

_T = GGMLQuantizationType

# Byte offset of each fp16 scale field in a block, and the field's value as a multiple of d.
# Mean-zero minimums: Q4_K/Q5_K/Q2_K store x = d*sc*q - dmin*m with sc, m, q independent and
# uniform, so dmin = d*E[q] cancels the mean; Q4_1/Q5_1 store x = d*q + m, so m = -d*E[q].
_SCALE_FIELDS: dict[GGMLQuantizationType, tuple[tuple[int, float], ...]] = {
    _T.Q4_0: ((0, 1.0),),
    _T.Q4_1: ((0, 1.0), (2, -7.5)),
    _T.Q5_0: ((0, 1.0),),
    _T.Q5_1: ((0, 1.0), (2, -15.5)),
    _T.Q8_0: ((0, 1.0),),
    _T.Q2_K: ((80, 1.0), (82, 1.5)),
    _T.Q3_K: ((108, 1.0),),
    _T.Q4_K: ((0, 1.0), (2, 7.5)),
    _T.Q5_K: ((0, 1.0), (2, 15.5)),
    _T.Q6_K: ((208, 1.0),),
    _T.IQ4_NL: ((0, 1.0),),
}


def _rms_uniform(lo: int, hi: int) -> float:
    """RMS of an integer uniform on [lo, hi]."""
    n = hi - lo + 1
    mean = (lo + hi) / 2
    return math.sqrt((n * n - 1) / 12 + mean * mean)


def _ms(lo: int, hi: int) -> float:
    return _rms_uniform(lo, hi) ** 2


def _k_rms(sc_hi: int, q_hi: int) -> float:
    """RMS of sc*q - E[q]*m for sc, m uniform on [0, sc_hi] and q uniform on [0, q_hi]."""
    esc, eq = sc_hi / 2, q_hi / 2
    msc, mq = _ms(0, sc_hi), _ms(0, q_hi)
    return math.sqrt(msc * mq - 2 * eq * esc * eq * esc + eq * eq * msc)


# RMS of the dequantized values of random blocks whose scale fields say d = 1 (the formats' integer
# ranges; tests/test_synth_layouts.py checks each against strata.quant.dequantize).
UNIT_RMS: dict[GGMLQuantizationType, float] = {
    _T.Q4_0: _rms_uniform(-8, 7),
    _T.Q4_1: _rms_uniform(0, 15) * math.sqrt(1 - 7.5**2 / _ms(0, 15)),
    _T.Q5_0: _rms_uniform(-16, 15),
    _T.Q5_1: _rms_uniform(0, 31) * math.sqrt(1 - 15.5**2 / _ms(0, 31)),
    _T.Q8_0: _rms_uniform(-128, 127),
    _T.Q2_K: _k_rms(15, 3),
    _T.Q3_K: _rms_uniform(-32, 31) * _rms_uniform(-4, 3),
    _T.Q4_K: _k_rms(63, 15),
    _T.Q5_K: _k_rms(63, 31),
    _T.Q6_K: _rms_uniform(-128, 127) * _rms_uniform(-32, 31),
    _T.IQ4_NL: math.sqrt(float(np.mean(np.square(IQ4_NL.kvalues, dtype=np.float64)))),
}
_FLOAT_TYPES = (_T.F32, _T.F16, _T.BF16)
SUPPORTED_TYPES: frozenset[GGMLQuantizationType] = frozenset((*_SCALE_FIELDS, *_FLOAT_TYPES))
_SPREAD_RMS = math.sqrt(13 / 12)  # RMS of u ~ U(0.5, 1.5), the per-block scale spread


def random_blocks(
    qtype: GGMLQuantizationType, num_blocks: int, rms: float, seed: np.random.SeedSequence
) -> np.ndarray:
    """`num_blocks` random blocks of a quantized type as uint8 bytes; values have RMS `rms`, mean 0."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    bits = np.random.SFC64(seed)
    nbytes = num_blocks * type_size
    # random_raw releases the GIL and runs at memory speed: several GB/s per core.
    data = bits.random_raw(-(-nbytes // 8)).view(np.uint8)[:nbytes]
    blocks = data.reshape(num_blocks, type_size)
    d = rms / (UNIT_RMS[qtype] * _SPREAD_RMS)
    scale = np.random.Generator(bits).random(num_blocks, dtype=np.float32)
    scale += 0.5
    scale *= d
    for offset, factor in _SCALE_FIELDS[qtype]:
        # (num_blocks, 2) uint8 columns viewed as (num_blocks, 1) float16
        blocks[:, offset : offset + 2].view(np.float16)[:, 0] = scale * factor
    return data


def random_floats(
    qtype: GGMLQuantizationType, count: int, mean: float, std: float, seed: np.random.SeedSequence
) -> np.ndarray:
    """`count` normal values as F32, F16 or BF16 bytes (uint8)."""
    x = np.random.Generator(np.random.SFC64(seed)).standard_normal(count, dtype=np.float32)
    x *= std
    x += mean
    if qtype == _T.F32:
        return x.view(np.uint8)
    if qtype == _T.F16:
        return x.astype(np.float16).view(np.uint8)
    if qtype == _T.BF16:
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)  # truncation to bf16
    raise ValueError(f"{qtype.name} is not a float type")


def random_data(
    qtype: GGMLQuantizationType, num_blocks: int, mean: float, std: float, seed: np.random.SeedSequence
) -> np.ndarray:
    """`num_blocks` blocks of `qtype` (a float type's block is one value) as uint8 bytes."""
    if qtype in _FLOAT_TYPES:
        return random_floats(qtype, num_blocks, mean, std, seed)
    if qtype not in _SCALE_FIELDS:
        raise ValueError(f"synthetic data in {qtype.name} is not supported")
    if mean != 0.0:
        raise ValueError(f"{qtype.name}: quantized synthetic data has mean 0 (asked for {mean})")
    return random_blocks(qtype, num_blocks, std, seed)
