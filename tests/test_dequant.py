"""strata.quant must reproduce gguf.quants.dequantize bit for bit."""

import numpy as np
import pytest
import torch
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from strata.quant import SUPPORTED_TYPES, dequantize, dequantize_rows

T = GGMLQuantizationType

# Byte offsets of each block's fp16 scale fields (d, and m / dmin where present), from the block
# layouts in gguf/quants.py. Random bytes there would often decode to NaN or Inf.
SCALE_OFFSETS: dict[GGMLQuantizationType, tuple[int, ...]] = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ2_XS: (0,),
    T.IQ2_S: (0,),
    T.IQ4_NL: (0,),
    T.IQ4_XS: (0,),
}
# Float types: (unsigned dtype of one element, mantissa bits, exponent mask).
FLOAT_LAYOUTS: dict[GGMLQuantizationType, tuple[type, int, int]] = {
    T.F32: (np.uint32, 23, 0xFF),
    T.F16: (np.uint16, 10, 0x1F),
    T.BF16: (np.uint16, 7, 0xFF),
}
ALL_TYPES = sorted([*FLOAT_LAYOUTS, *SCALE_OFFSETS])
N_BLOCKS = 300
N_FLOATS = 4096


def random_bytes(qtype: GGMLQuantizationType, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random stored bytes for n_blocks blocks of qtype, with every float field finite."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    if qtype in FLOAT_LAYOUTS:
        dtype, mant_bits, exp_mask = FLOAT_LAYOUTS[qtype]
        bits = rng.integers(0, np.iinfo(dtype).max, n_blocks, dtype=dtype, endpoint=True)
        special = ((bits >> mant_bits) & exp_mask) == exp_mask
        # Clearing the lowest exponent bit turns an Inf/NaN pattern into a large finite value.
        bits[special] ^= dtype(1 << mant_bits)
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    for offset in SCALE_OFFSETS[qtype]:
        scale = rng.uniform(0.001, 0.1, n_blocks) * rng.choice([-1.0, 1.0], n_blocks)
        raw[:, offset : offset + 2] = scale.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def reference(raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> torch.Tensor:
    out = quants.dequantize(raw.reshape(-1), qtype)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(shape)


def n_blocks_for(qtype: GGMLQuantizationType) -> int:
    return N_FLOATS if qtype in FLOAT_LAYOUTS else N_BLOCKS


def check_against_reference(qtype: GGMLQuantizationType, seed: int) -> None:
    block_size, _ = GGML_QUANT_SIZES[qtype]
    n_blocks = n_blocks_for(qtype)
    raw = random_bytes(qtype, n_blocks, np.random.default_rng(seed))
    shape = (n_blocks * block_size,)
    ours = dequantize(torch.from_numpy(raw), qtype, shape)
    assert ours.dtype == torch.float32
    assert ours.shape == shape
    expected = reference(raw, qtype, shape)
    assert not expected.isnan().any(), f"test data for {qtype.name} decodes to NaN (seed {seed})"
    mismatch = (ours != expected).nonzero()
    assert torch.equal(ours, expected), (
        f"{qtype.name} seed {seed}: {len(mismatch)} mismatches, first at {mismatch[:5].flatten().tolist()}"
    )


def test_supported_types() -> None:
    assert set(ALL_TYPES) == SUPPORTED_TYPES
    assert isinstance(SUPPORTED_TYPES, frozenset)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matches_reference(qtype: GGMLQuantizationType) -> None:
    check_against_reference(qtype, seed=1000 + int(qtype))


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matches_reference_fresh_seed(qtype: GGMLQuantizationType) -> None:
    # A new seed each run widens coverage over time; the failure message names it for replay.
    check_against_reference(qtype, seed=np.random.SeedSequence().entropy)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_2d_shape(qtype: GGMLQuantizationType) -> None:
    shape = (3, 512)
    block_size, _ = GGML_QUANT_SIZES[qtype]
    raw = random_bytes(qtype, 3 * 512 // block_size, np.random.default_rng(7))
    # raw may arrive in any shape, e.g. one row of bytes per tensor row.
    ours = dequantize(torch.from_numpy(raw).reshape(3, -1), qtype, shape)
    assert ours.dtype == torch.float32
    assert ours.shape == shape
    assert torch.equal(ours, reference(raw, qtype, shape))


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_rows(qtype: GGMLQuantizationType) -> None:
    shape = (7, 512)
    block_size, _ = GGML_QUANT_SIZES[qtype]
    raw = torch.from_numpy(random_bytes(qtype, 7 * 512 // block_size, np.random.default_rng(11)))
    rows = torch.tensor([6, 0, 3, 3])
    picked = dequantize_rows(raw, qtype, shape, rows)
    assert picked.dtype == torch.float32
    assert picked.shape == (4, 512)
    assert torch.equal(picked, dequantize(raw, qtype, shape)[rows])


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16, T.Q8_0, T.Q6_K, T.IQ4_XS], ids=lambda t: t.name)
def test_unaligned_read_only_input(qtype: GGMLQuantizationType) -> None:
    # A memmap slice can start at an odd address, and the input must never be written to.
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = random_bytes(qtype, 1, np.random.default_rng(3))
    buf = torch.zeros(raw.size + 1, dtype=torch.uint8)
    buf[1:] = torch.from_numpy(raw)
    before = buf.clone()
    ours = dequantize(buf[1:], qtype, (block_size,))
    assert torch.equal(ours, reference(raw, qtype, (block_size,)))
    assert torch.equal(buf, before)
    ours.fill_(1.0)  # the result is a fresh tensor, never an alias of the input bytes
    assert torch.equal(buf, before)


def test_large_chunked_tensor() -> None:
    # Big enough to be decoded in several chunks, with a partial last chunk.
    shape = (70, 32 * 1000)
    raw = random_bytes(T.Q8_0, 70 * 1000, np.random.default_rng(5))
    assert torch.equal(dequantize(torch.from_numpy(raw), T.Q8_0, shape), reference(raw, T.Q8_0, shape))


@pytest.mark.parametrize("qtype", [T.IQ1_S, T.TQ1_0, T.Q8_1], ids=lambda t: t.name)
def test_unsupported_type(qtype: GGMLQuantizationType) -> None:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = torch.zeros(type_size, dtype=torch.uint8)
    with pytest.raises(ValueError, match=qtype.name) as info:
        dequantize(raw, qtype, (block_size,))
    assert "Q4_K" in str(info.value) and "IQ2_XS" in str(info.value)
    with pytest.raises(ValueError, match=qtype.name):
        dequantize_rows(raw, qtype, (1, block_size), torch.tensor([0]))


def test_size_mismatch() -> None:
    raw = torch.zeros(70, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"72.*70"):
        dequantize(raw, T.Q4_0, (2, 64))
    with pytest.raises(ValueError, match=r"72.*70"):
        dequantize_rows(raw, T.Q4_0, (2, 64), torch.tensor([0]))


def test_row_not_multiple_of_block() -> None:
    with pytest.raises(ValueError, match="256"):
        dequantize(torch.zeros(144, dtype=torch.uint8), T.Q4_K, (1, 255))
