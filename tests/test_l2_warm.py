"""STRATA_L2_WARM's plan on the CPU: which bytes each block asks L2 for, cut into the kernel's table.
The kernel itself is Hopper's bulk prefetch (no interpreter runs it): compile_check builds it for
sm_90 and checks its PTX; test_model_kernel_path runs it on a GPU, the tokens unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from strata.layers.l2_warm import L2Warmer, warm_windows, weight_ranges

pytest.importorskip("triton")


def test_windows_cover_each_byte_once_from_the_second_weight_on():
    # Two blocks of weights 10, 20, 30 bytes (two planes in the second), a head of 50; each block's
    # window starts after its first weight. Wide enough to reach past a layer: each later block takes
    # up where the last stopped, so no byte is asked for twice and all but block 0's first weight are.
    blocks = [
        [[(1000, 10)], [(2000, 5), (3000, 15)], [(4000, 30)]],
        [[(5000, 10)], [(6000, 20)], [(7000, 30)]],
    ]
    head = [[(9000, 50)]]
    windows = warm_windows(blocks, head, ahead=70)
    assert windows[0] == [(2000, 5), (3000, 15), (4000, 30), (5000, 10), (6000, 10)]
    assert windows[1] == [(6010, 10), (7000, 30), (9000, 20)]
    # Narrower than a layer: each window is its block's next `ahead` bytes, none skipped or repeated.
    windows = warm_windows(blocks, head, ahead=25)
    assert windows == [[(2000, 5), (3000, 15), (4000, 5)], [(6000, 20), (7000, 5)]]


def test_windows_overlap_only_where_asked_once():
    # A window reaching into the next block's first weight leaves the next block's window to start
    # past what it covered.
    blocks = [[[(0, 8)], [(100, 8)]], [[(200, 8)], [(300, 8)]]]
    assert warm_windows(blocks, [], ahead=20) == [[(100, 8), (200, 8), (300, 4)], [(304, 4)]]
    assert warm_windows(blocks, [], ahead=0) == [[], []]


def test_chunk_table_rounds_inward_and_cuts_chunks():
    from strata.kernels import l2_warm

    chunk = l2_warm.CHUNK
    # Bytes 1000 to 1000 + 3 chunks: from 1008 (rounded up) to 992 + 3 chunks (rounded down), cut into
    # two whole chunks and one 16 bytes short; (7, 20) holds no whole aligned 16 bytes: no row.
    table = l2_warm.chunk_table([(1000, 3 * chunk), (7, 20)], torch.device("cpu"))
    assert table.dtype == torch.int64
    assert table.tolist() == [[1008, chunk], [1008 + chunk, chunk], [1008 + 2 * chunk, chunk - 16]]
    assert l2_warm.chunk_table([], torch.device("cpu")).shape == (0, 2)


def test_weight_ranges_follow_the_blocks_read_order(tmp_path: Path, monkeypatch):
    # The 0.5B tiny layout on the kernel path (CPU, interpreter): per block q+k+v (one stacked
    # weight), the attention output, gate+up, down, each its packed planes; and no warmer on the CPU.
    from strata.gguf.reader import GGUFFile
    from strata.gguf.spec import ModelSpec
    from strata.models import build_model
    from strata.synth.layouts import load_layout
    from strata.synth.writer import write_layout

    path = tmp_path / "m.gguf"
    write_layout(path, load_layout("qwen2.5-0.5b-tiny"), seed=0)
    monkeypatch.setenv("STRATA_TRITON_ON_CPU", "1")
    monkeypatch.setenv("STRATA_L2_WARM", "16")
    gguf = GGUFFile(path)
    model = build_model(gguf, ModelSpec.from_gguf(gguf), dtype=torch.float32, device="cpu")
    assert model.place.kernels and model.l2_warm is None  # a CUDA GPU's (Hopper's) only
    block = model.blk[0]
    layers = [block.qkv_proj.parts[n] for n in block.qkv_proj.parts] + [block.attn_output]
    layers += [block.gate_up.parts[n] for n in block.gate_up.parts] + [block.ffn_down]
    expected = [[(t.data_ptr(), t.numel() * t.element_size()) for t in x.packed.planes] for x in layers]
    assert weight_ranges(block) == expected
    assert L2Warmer.build(model.blk, model.output, 16 << 20, 4) is None
