"""Tensor parallelism without processes: the shard helpers cut GGUF bytes into parts that dequantize
to exactly the slices of the whole weight; the uneven FFN and windowed attn_output parts reproduce the
whole matmul at the real Qwen2.5 widths (each rank's layer built in float64, the ranks summed by the
test); the real layouts pass the start check; shapes that do not split fail at start naming the tensor.
The runs over gloo are in tests/test_tensor_parallel.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from strata.engine.llm import LLM, ModelConfig
from strata.gguf.reader import GGUFFile, TensorInfo
from strata.gguf.synth import SynthSpec, write_synthetic
from strata.layers.activation import gated
from strata.layers.linear import QuantLinear
from strata.layers.placement import Placement
from strata.parallel.group import TensorParallel
from strata.parallel.plan import check_tensors
from strata.parallel.shard import column_bytes, part_of, shard_matrix
from strata.quant import dequantize
from strata.synth.blocks import random_blocks
from strata.synth.layouts import BUILTIN_LAYOUTS, plan_tensors

_T = GGMLQuantizationType


# ---- shard helpers ------------------------------------------------------------------------------


def _random(qtype: GGMLQuantizationType, shape: tuple[int, int], seed: int) -> torch.Tensor:
    """Random stored bytes of a (rows, cols) matrix whose values have RMS 1/sqrt(cols), as weights do."""
    num_blocks = shape[0] * shape[1] // GGML_QUANT_SIZES[qtype][0]
    blocks = random_blocks(qtype, num_blocks, shape[1] ** -0.5, np.random.SeedSequence(seed))
    return torch.from_numpy(blocks.copy())


def _table(tensors: dict[str, tuple[GGMLQuantizationType, tuple[int, int]]]) -> dict[str, TensorInfo]:
    return {name: TensorInfo(name, qtype, shape, 0, 0) for name, (qtype, shape) in tensors.items()}


@pytest.mark.parametrize("qtype", [_T.Q4_0, _T.Q8_0, _T.Q4_K, _T.Q6_K])
@pytest.mark.parametrize("size", [2, 4])
def test_parts_dequantize_to_the_slices_of_the_whole_weight(qtype: GGMLQuantizationType, size: int) -> None:
    rows, cols = 12, 4 * 256
    raw = _random(qtype, (rows, cols), int(qtype) * 10 + size)
    whole = dequantize(raw, qtype, (rows, cols))
    table = _table({f"blk.0.{n}.weight": (qtype, (rows, cols)) for n in ("attn_q", "attn_output")})
    table["output.weight"] = TensorInfo("output.weight", qtype, (11, cols), 0, 0)
    vocab_parts = []
    for rank in range(size):
        tp = TensorParallel(rank, size)
        part = part_of(table, "blk.0.attn_q", tp)
        stored, shape = shard_matrix(raw, qtype, (rows, cols), "out", part)
        r = slice(rank * rows // size, (rank + 1) * rows // size)
        assert torch.equal(dequantize(stored, qtype, shape), whole[r])
        part = part_of(table, "blk.0.attn_output", tp)
        assert part.pad is None  # whole blocks: stored as they are
        stored, shape = shard_matrix(raw, qtype, (rows, cols), "in", part)
        c = slice(rank * cols // size, (rank + 1) * cols // size)
        assert torch.equal(dequantize(stored, qtype, shape), whole[:, c])
        # 11 vocabulary rows: runs of ceil(11 / size), the last one shorter.
        part = part_of(table, "output", tp)
        stored, shape = shard_matrix(raw[: 11 * raw.numel() // rows], qtype, (11, cols), "vocab", part)
        vocab_parts.append(dequantize(stored, qtype, shape))
    assert [p.shape[0] for p in vocab_parts] == ([6, 5] if size == 2 else [3, 3, 3, 2])
    assert torch.equal(torch.cat(vocab_parts), whole[:11])


def test_column_bytes_refuse_a_run_off_block_boundaries() -> None:
    with pytest.raises(ValueError, match=r"columns 0\.\.128 do not start and end on Q4_K blocks of 256"):
        column_bytes(torch.zeros(8 * 144, dtype=torch.uint8), _T.Q4_K, (8, 256), 0, 128)


def _write(path: Path, tensors: dict[str, tuple[GGMLQuantizationType, tuple[int, int]]]) -> GGUFFile:
    """A GGUF file holding just these random tensors (no model metadata: `QuantLinear.load` needs none)."""
    writer = GGUFWriter(str(path), "llama")
    for i, (name, (qtype, shape)) in enumerate(tensors.items()):
        # gguf-py reads the shape from the bytes' shape: (rows, bytes per row).
        writer.add_tensor(name, _random(qtype, shape, i).numpy().reshape(shape[0], -1), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GGUFFile(path)


def _ranks(gguf: GGUFFile, layer: str, size: int) -> list[QuantLinear]:
    """Each rank's part of the layer, in float64 so that only the order of the sums differs."""
    return [
        QuantLinear.load(gguf, layer, Placement(torch.float64, tp=TensorParallel(r, size)))
        for r in range(size)
    ]


@pytest.fixture
def no_all_reduce(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layers' all-reduce becomes a no-op: a test sums the ranks' outputs itself."""
    monkeypatch.setattr("strata.layers.linear.all_reduce", lambda y, tp: y)


# (ffn width, ranks, each rank's number of ffn_down blocks): the real Qwen2.5 FFN widths.
UNEVEN_FFN = [
    (4864, 2, [10, 9]),  # 0.5B: 19 blocks
    (8960, 2, [18, 17]),  # 1.5B: 35 blocks
    (18944, 4, [19, 19, 18, 18]),  # 7B: 74 blocks
]


@pytest.mark.parametrize("down_type", [_T.Q4_K, _T.Q6_K], ids=["Q4_K", "Q6_K"])
@pytest.mark.parametrize(("ffn", "size", "blocks"), UNEVEN_FFN)
def test_an_uneven_ffn_split_reproduces_the_whole_ffn(
    tmp_path: Path,
    no_all_reduce: None,
    down_type: GGMLQuantizationType,
    ffn: int,
    size: int,
    blocks: list[int],
) -> None:
    """The FFN splits in runs of whole ffn_down blocks; gate/up take the same rows. The parts are exactly
    the slices of the whole weights (torch.equal), and the FFN summed over ranks equals the whole one in
    float64 up to the order of the sums (relative 1e-12; float64 rounding is about 1e-16). The FFN widths
    are the real ones; the hidden size is scaled down to 32, with Q8_0 gate/up (their rows, which split,
    have no block constraint)."""
    hidden = 32
    gguf = _write(
        tmp_path / "ffn.gguf",
        {
            "blk.0.ffn_gate.weight": (_T.Q8_0, (ffn, hidden)),
            "blk.0.ffn_up.weight": (_T.Q8_0, (ffn, hidden)),
            "blk.0.ffn_down.weight": (down_type, (hidden, ffn)),
        },
    )
    one = {n: _ranks(gguf, f"blk.0.{n}", 1)[0] for n in ("ffn_gate", "ffn_up", "ffn_down")}
    parts = {n: _ranks(gguf, f"blk.0.{n}", size) for n in ("ffn_gate", "ffn_up", "ffn_down")}
    assert [layer.in_features for layer in parts["ffn_down"]] == [256 * b for b in blocks]
    start = 0
    for r, end in enumerate(np.cumsum([256 * b for b in blocks]).tolist()):
        down = parts["ffn_down"][r]
        assert down.pad is None  # whole blocks: never padded
        for n in ("ffn_gate", "ffn_up"):
            assert parts[n][r].weight is not None and one[n].weight is not None
            assert torch.equal(parts[n][r].weight, one[n].weight[start:end])
        assert down.weight is not None and one["ffn_down"].weight is not None
        assert torch.equal(down.weight, one["ffn_down"].weight[:, start:end])
        start = end
    assert start == ffn

    h = torch.randn(5, hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def run(gate: QuantLinear, up: QuantLinear, down: QuantLinear) -> torch.Tensor:
        return down(gated("silu", gate(h), up(h), fused=False))

    whole = run(one["ffn_gate"], one["ffn_up"], one["ffn_down"])
    summed = sum(run(*layers) for layers in zip(*parts.values(), strict=True))
    assert isinstance(summed, torch.Tensor)
    torch.testing.assert_close(summed, whole, rtol=1e-12, atol=1e-12)


# (attn_output columns = heads * head_dim, ranks): 3,584 is the 7B's (28 heads of 128): whole Q4_K
# blocks over 2 ranks, 3.5 blocks each over 4; 768 (12 heads of 64) is 1.5 blocks over 2, 0.75 over 4.
ATTN_OUTPUT = [(3584, 2), (3584, 4), (768, 2), (768, 4)]


@pytest.mark.parametrize("qtype", [_T.Q4_K, _T.Q6_K], ids=["Q4_K", "Q6_K"])
@pytest.mark.parametrize(("cols", "size"), ATTN_OUTPUT)
def test_a_windowed_attn_output_reproduces_the_whole_matmul(
    tmp_path: Path, no_all_reduce: None, qtype: GGMLQuantizationType, cols: int, size: int
) -> None:
    """A rank whose columns are not whole blocks holds the blocks around them and zero-pads its input.
    Fed the identity, the ranks' outputs sum to exactly the whole weight (torch.equal: one nonzero
    product per entry), so each column is counted once, at its place; a random input gives the whole
    product in float64 up to the order of the sums (relative 1e-12). Rows are scaled down (48)."""
    gguf = _write(tmp_path / "attn.gguf", {"blk.0.attn_output.weight": (qtype, (48, cols))})
    one, parts = _ranks(gguf, "blk.0.attn_output", 1)[0], _ranks(gguf, "blk.0.attn_output", size)
    width = cols // size
    aligned = width % 256 == 0
    assert all((layer.pad is None) == aligned for layer in parts)  # only unaligned runs are padded
    assert all(layer.in_features % 256 == 0 for layer in parts)
    eye = torch.eye(cols, dtype=torch.float64)
    random = torch.randn(7, cols, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for x, exact in ((eye, True), (random, False)):
        whole = one(x)
        summed = sum(layer(x[:, r * width : (r + 1) * width]) for r, layer in enumerate(parts))
        assert isinstance(summed, torch.Tensor)
        if exact:
            assert torch.equal(summed, whole)
        else:
            torch.testing.assert_close(summed, whole, rtol=1e-12, atol=1e-12)


# ---- the start check ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "size"), [("qwen2.5-0.5b", 2), ("qwen2.5-1.5b", 2), ("qwen2.5-7b", 2), ("qwen2.5-7b", 4)]
)
def test_the_real_qwen_layouts_split(layout: str, size: int) -> None:
    """The tensor tables of the real Q4_K_M files (from the synthetic layouts; no file is written)."""
    s = BUILTIN_LAYOUTS[layout]
    table = {t.name: t for t in plan_tensors(s)}
    check_tensors(table, s.num_heads, s.num_kv_heads, size)
    for layer in range(s.num_layers):
        p = f"blk.{layer}"
        ffn = [part_of(table, f"{p}.ffn_down", TensorParallel(r, size)) for r in range(size)]
        widths = [x.end - x.start for x in ffn]
        assert sum(widths) == s.ffn_size and max(widths) - min(widths) <= 256
        for r in range(size):
            for n in ("ffn_gate", "ffn_up"):
                row = part_of(table, f"{p}.{n}", TensorParallel(r, size))
                assert (row.start, row.end) == (ffn[r].start, ffn[r].end)
    pads = [part_of(table, "blk.0.attn_output", TensorParallel(r, size)).pad for r in range(size)]
    if (layout, size) == ("qwen2.5-7b", 4):
        assert widths == [4864, 4864, 4608, 4608]
        assert pads == [(0, 128), (128, 0), (0, 128), (128, 0)]  # 896 columns: 3.5 Q4_K blocks each
    else:
        assert pads == [None] * size  # heads on block boundaries: stored as they are, no padding


@pytest.mark.parametrize(
    ("layout", "size", "message"),
    [
        ("qwen2.5-7b", 3, r"blk\.0\.attn_k\.weight of shape \(512, 3584\): its 4 KV heads .* 3 ranks"),
        ("qwen2.5-0.5b", 4, r"blk\.0\.attn_k\.weight of shape \(128, 896\): its 2 KV heads .* 4 ranks"),
    ],
)
def test_real_layouts_whose_heads_do_not_divide_are_refused(layout: str, size: int, message: str) -> None:
    s = BUILTIN_LAYOUTS[layout]
    with pytest.raises(ValueError, match=message) as info:
        check_tensors({t.name: t for t in plan_tensors(s)}, s.num_heads, s.num_kv_heads, size)
    assert f"(--tensor-parallel {size})" in str(info.value)


@pytest.mark.parametrize(
    ("spec", "size", "message"),
    [
        # 2 KV heads over 4 ranks (the 4 attention heads would split)
        (SynthSpec("llama"), 4, r"blk\.0\.attn_k\.weight of shape \(32, 64\): its 2 KV heads .* 4 ranks"),
        # an FFN of one Q8_0 block: nothing for the second rank
        (
            SynthSpec("llama", ffn_size=32),
            2,
            r"blk\.0\.ffn_down\.weight of shape \(64, 32\) \(Q8_0\): .* 1 block\(s\) of 32, fewer than 2",
        ),
    ],
)
def test_shapes_that_do_not_split_fail_at_start(
    tmp_path: Path, spec: SynthSpec, size: int, message: str
) -> None:
    path = write_synthetic(tmp_path / "m.gguf", spec)
    with pytest.raises(ValueError, match=message) as info:
        LLM(ModelConfig(path, tensor_parallel=size))
    assert f"--tensor-parallel {size}" in str(info.value)
    assert not dist.is_initialized()  # refused before any process started


def test_more_ranks_than_gpus_names_the_flag_the_count_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        ValueError, match=r"--tensor-parallel 4 needs 4 GPUs.*sees 2.*--tensor-parallel 2 or fewer"
    ):
        ModelConfig(Path("m.gguf"), device="cuda", tensor_parallel=4)
    with pytest.raises(ValueError, match="at least 1"):
        ModelConfig(Path("m.gguf"), tensor_parallel=0)
