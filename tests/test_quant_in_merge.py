"""The o projection's int8 x made by decode attention's merge kernel (STRATA_QUANT_IN_MERGE): the same
bits as the attention's output followed by `quantize_x`, for heads the merge combines and heads one
split wrote alone (read back), in the merge's one-tile and chunked forms and in both int8 orders; none
attached where no merge kernel runs or a head's sub-blocks are not its own; and the model's greedy ids
unchanged with the merge's quantization in place of the o projection's `quantize_x` launch."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

import strata.kernels.int8_inputs as int8_inputs  # noqa: E402
from strata.kernels.paged_attention import paged_decode_attention  # noqa: E402
from tests.test_kernels_paged_attention import DEVICE, make_case  # noqa: E402
from tests.test_kernels_quant_matvec import T  # noqa: E402


def attend(context_lens, heads, kv_heads, dim, dtype, num_splits, order, block_t=16, window=None):
    q, k, v, tables, lens, _ = make_case(context_lens, heads, kv_heads, dim, 16, dtype, seed=dim + num_splits)
    args = [t.to(DEVICE) for t in (q, k, v, tables, lens)]
    launch = dict(block_size=16, num_splits=num_splits, block_t=block_t, window=window)
    plain = paged_decode_attention(*args, **launch)
    out = paged_decode_attention(*args, **launch, int8_order=order)
    assert torch.equal(out, plain)  # the output itself is unchanged
    return out, int8_inputs.attached_int8(out)


@pytest.mark.parametrize("order", [True, False], ids=["planar", "element"])
@pytest.mark.parametrize(
    "context_lens,heads,kv_heads,dim,dtype,splits,window",
    [
        ([1, 17, 300], 4, 2, 32, torch.bfloat16, 8, None),  # 1 and 17 positions: one split alone
        ([40, 200], 7, 1, 64, torch.float16, 4, None),  # a group of seven, two sub-blocks a head
        ([130], 2, 2, 128, torch.bfloat16, 3, 100),  # four sub-blocks a head, a window
        ([3000, 17], 2, 1, 32, torch.bfloat16, 100, None),  # the merge in chunks (past 64 splits)
    ],
)
def test_bit_equal_to_attention_then_quantization(order, context_lens, heads, kv_heads, dim, dtype, splits,
                                                  window):  # fmt: skip
    out, int8 = attend(context_lens, heads, kv_heads, dim, dtype, splits, order, window=window)
    assert int8 is not None and list(int8) == [order]
    want = int8_inputs.quantize_x(out.flatten(1), planar=order)
    assert all(torch.equal(a, b) for a, b in zip(int8[order], want, strict=True))


@pytest.mark.parametrize(
    "dim,splits,order", [(32, 1, True), (48, 4, True), (16, 4, False), (32, 4, None)]
)  # fmt: skip
def test_nothing_attached_where_the_merge_cannot_quantize(dim, splits, order):
    # One split: no merge kernel runs (the o projection quantizes as before). A head of 48 or 16: its
    # 32-element sub-blocks are not the program's own. No order: nothing asked.
    _, int8 = attend([17, 90], 4, 2, dim, torch.bfloat16, splits, order)
    assert int8 is None


def test_the_layer_attaches_it_for_the_o_projection(monkeypatch):
    # Attention on the kernel path with a Q4_K (planar) o projection: with the setting, its decode
    # output (flattened, as the o projection takes it) carries the merge's quantization, equal to
    # `quantize_x` of that output; without it, or past STRATA_MATVEC_ROWS rows, nothing is attached.
    from types import SimpleNamespace

    from strata.kernels.quant_pack import pack_quant_weight
    from strata.layers.attention import Attention
    from tests.test_kernels_quant_matvec import random_weight

    q, k, v, tables, lens, _ = make_case([40, 300, 9], 4, 2, 64, 16, torch.bfloat16, seed=11)
    kv = SimpleNamespace(layer=lambda i: (k.to(DEVICE), v.to(DEVICE)))
    paged = SimpleNamespace(
        block_tables=tables.to(DEVICE), context_lens=lens.to(DEVICE), block_size=16, num_splits=4,
        max_context_len=320, max_splits=0, block_t=16, num_stages=0,
    )  # fmt: skip
    packed = pack_quant_weight(random_weight(T.Q4_K, 256, 256, seed=1).to(DEVICE), T.Q4_K, 256, 256, "planar")
    o_proj = SimpleNamespace(packed=packed, pad=None)

    def attend(setting: str, rows: str = "16") -> tuple[torch.Tensor, dict | None]:
        monkeypatch.setenv("STRATA_QUANT_IN_MERGE", setting)
        monkeypatch.setenv("STRATA_MATVEC_ROWS", rows)
        attn = Attention(0, 4, 2, 64**-0.5, None, None, fused=True)  # type: ignore[arg-type]
        attn.quantize_for(o_proj)  # type: ignore[arg-type]
        out = attn._paged_decode(q.to(DEVICE), kv, paged)  # type: ignore[arg-type]
        return out, int8_inputs.attached_int8(out)

    out, int8 = attend("1")
    assert out.shape == (3, 256) and int8 is not None and list(int8) == [True]
    want = int8_inputs.quantize_x(out, planar=True)
    assert all(torch.equal(a, b) for a, b in zip(int8[True], want, strict=True))
    plain, none = attend("0")
    assert torch.equal(plain, out) and none is None
    assert attend("1", rows="2")[1] is None  # 3 rows: the o projection takes the matmul


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the real vocabulary's head is slow in the interpreter"
)
def test_gpu_model_keeps_the_tokens_with_fewer_launches(monkeypatch, tmp_path):
    # The 1.5B's tiny layout (Q4_K o projections) in bf16 in CUDA graphs: with the setting the o
    # projection's x comes from the merge where one runs, so fewer `quantize_x` launches are ungated
    # (the down projections' carry SwiGLU; the short graphs' one-split steps keep the o projection's
    # own), and the greedy ids are the same.
    from tests.launch_recorder import LaunchRecorder
    from tests.test_model_kernel_path import greedy_ids, tiny

    path = tiny(tmp_path, "qwen2.5-1.5b-tiny")
    recorder = LaunchRecorder(int8_inputs.quantize_x_kernel)

    def run() -> tuple[list[list[int]], list[bool]]:
        recorder.launches.clear()
        ids = greedy_ids(path, DEVICE, kernels=True, num_tokens=16, dtype=torch.bfloat16)
        return ids, [launch["ACT"] != 0 for launch in recorder.launches]

    monkeypatch.setattr(int8_inputs, "quantize_x_kernel", recorder)
    monkeypatch.setenv("STRATA_QUANT_IN_MERGE", "0")
    want, without = run()
    monkeypatch.setenv("STRATA_QUANT_IN_MERGE", "1")
    ids, launched = run()
    assert ids == want
    assert without.count(False) > 0 and launched.count(False) < without.count(False), (without, launched)
    assert launched.count(True) == without.count(True)
