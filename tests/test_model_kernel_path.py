"""The whole model on the kernel path (fused dequant matvec, paged decode attention, CUDA graphs)
against the torch reference path: greedy token ids must be equal.

Without a GPU the kernel path runs on CPU tensors in Triton's interpreter (STRATA_TRITON_ON_CPU=1,
TRITON_INTERPRET=1) on tiny models, for a few tokens: slow, but every kernel the model calls runs.
With CUDA the same comparison runs on the GPU for 64 tokens, with CUDA graphs, on tiny models in the
real layouts (the 0.5B's Q5_0/Q8_0 mix and the 1.5B's Q4_K/Q6_K mix), the reference on the CPU.
Both sides compute in float32, so equal ids are expected: the kernels only reorder fp32 sums.
"""

from __future__ import annotations

import os

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from gguf.constants import GGMLQuantizationType  # noqa: E402

pytest.importorskip("triton")

from strata.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from strata.engine.sampler import SamplingParams  # noqa: E402
from strata.engine.scheduler import SchedulerConfig  # noqa: E402
from strata.gguf.reader import GGUFFile  # noqa: E402
from strata.gguf.spec import ModelSpec  # noqa: E402
from strata.gguf.synth import SynthSpec, write_synthetic  # noqa: E402
from strata.models import build_model  # noqa: E402
from strata.prompt.tokenizer import Tokenizer  # noqa: E402
from strata.synth.layouts import load_layout  # noqa: E402
from strata.synth.writer import write_layout  # noqa: E402

T = GGMLQuantizationType
cuda_only = pytest.mark.skipif(not CUDA, reason="CUDA graphs and the real-layout models need a GPU")


def greedy_ids(
    path: Path,
    device: str,
    kernels: bool,
    num_tokens: int,
    dtype: torch.dtype = torch.float32,
    setup: Callable[[LLMEngine], None] | None = None,
    **engine: object,
) -> list[list[int]]:
    """Three prompts of different lengths decoded together (so decode batches are ragged); `setup`
    may change the engine before they are added."""
    os.environ["STRATA_TRITON_ON_CPU"] = "1" if kernels and device == "cpu" else "0"
    try:
        gguf = GGUFFile(path)
        model = build_model(gguf, ModelSpec.from_gguf(gguf), dtype=dtype, device=device)
    finally:
        os.environ.pop("STRATA_TRITON_ON_CPU")
    assert model.place.kernels == kernels
    e = LLMEngine(model, Tokenizer.from_gguf(gguf.metadata), EngineConfig(num_blocks=64, **engine))  # type: ignore[arg-type]
    if setup is not None:
        setup(e)
    params = SamplingParams(max_tokens=num_tokens, ignore_eos=True)
    requests = [
        e.add_request([(7 * i + 11 * j) % 200 + 3 for j in range(9 + 13 * i)], params) for i in range(3)
    ]
    while e.has_unfinished():
        e.step()
    assert e.blocks.num_free_blocks == 64  # free or cached: every block came back
    return [list(r.output_ids) for r in requests]


# A prefill of all three prompts at once is 66 rows (the dense-weight cuBLAS path); 24-token chunks
# take the fused dequant matmul (and the prefill attention kernel), decode steps the fused matvec.
@pytest.mark.parametrize("qtype,chunk", [(T.Q8_0, 2048), (T.Q5_0, 24)])
def test_kernel_path_matches_reference_in_the_interpreter(
    qtype: GGMLQuantizationType, chunk: int, tmp_path: Path
) -> None:
    spec = SynthSpec(
        "qwen2", hidden_size=128, ffn_size=256, num_heads=4, num_kv_heads=2, head_dim=64, weight_type=qtype
    )
    path = write_synthetic(tmp_path / "m.gguf", spec)
    device = "cuda" if CUDA else "cpu"
    ref = greedy_ids(path, "cpu", kernels=False, num_tokens=3)  # a prefill's token and two decode steps
    # Chunked, the paged prefill kernel attends later chunks over the cached earlier ones.
    options = {
        "cuda_graphs": False,
        "prefill_kernel": chunk < 66,
        "scheduler": SchedulerConfig(max_num_batched_tokens=chunk),
    }
    assert greedy_ids(path, device, kernels=True, num_tokens=3, **options) == ref


def test_batched_decode_through_the_fused_matmul(monkeypatch, tmp_path: Path) -> None:
    # STRATA_MATVEC_ROWS=1: the decode steps' 2-3 rows take the tensor-core matmul (5-63 rows by
    # default; the planar Q4_K matmul is checked in test_kernels_quant_matmul).
    monkeypatch.setenv("STRATA_MATVEC_ROWS", "1")
    spec = SynthSpec(
        "qwen2", hidden_size=256, ffn_size=512, num_heads=4, num_kv_heads=2, head_dim=64, weight_type=T.Q8_0
    )
    path = write_synthetic(tmp_path / "m.gguf", spec)
    ref = greedy_ids(path, "cpu", kernels=False, num_tokens=3)
    options = {"cuda_graphs": False, "scheduler": SchedulerConfig(24)}
    assert greedy_ids(path, "cuda" if CUDA else "cpu", kernels=True, num_tokens=3, **options) == ref


@pytest.mark.parametrize("stack", ["0", "1"], ids=["copies", "stacked copies"])
def test_dense_copies_match_reference(monkeypatch, stack: str, tmp_path: Path) -> None:
    # STRATA_DENSE_COPY=1: the 66-row prefill multiplies the dense copies, decode steps the fused
    # matvecs. No stacking by type here, so q, k, v (with qwen2's biases) and gate, up are separate
    # parts; STRATA_DENSE_STACK=1 then runs each group as one matmul over their copies side by side.
    import strata.layers.linear as linear

    spec = SynthSpec("qwen2", hidden_size=128, ffn_size=256, num_heads=4, num_kv_heads=2, head_dim=64)
    path = write_synthetic(tmp_path / "m.gguf", spec)
    ref = greedy_ids(path, "cpu", kernels=False, num_tokens=3)
    monkeypatch.setenv("STRATA_DENSE_COPY", "1")
    monkeypatch.setenv("STRATA_DENSE_STACK", stack)
    monkeypatch.setattr(linear, "_stackable", lambda first, layer: False)
    stacked, real = [], linear._stack_copies
    monkeypatch.setattr(linear, "_stack_copies", lambda *a: stacked.append(real(*a)) or stacked[-1])
    options = {"cuda_graphs": False, "prefill_kernel": False}
    assert greedy_ids(path, "cuda" if CUDA else "cpu", kernels=True, num_tokens=3, **options) == ref
    assert len(stacked) == (4 if stack == "1" else 0) and all(s is not None for s in stacked)


# Each architecture's own pieces on the kernel path: llama's interleaved rotary, qwen3's QK-norm on
# head views, gemma3's sandwich norms, GeGLU, tied head and sliding window (8 < the 30-token context).
ARCH_SPECS = {
    "llama": SynthSpec("llama"),
    "qwen3": SynthSpec("qwen3", num_heads=2, num_kv_heads=1, head_dim=128),
    "gemma3": SynthSpec("gemma3", num_heads=2, num_kv_heads=1, head_dim=256, tied_embeddings=True),
}


@pytest.mark.parametrize("prefill_kernel", [False, True], ids=["reference prefill", "prefill kernel"])
@pytest.mark.parametrize("arch", sorted(ARCH_SPECS))
def test_every_architecture_on_the_kernel_path(arch: str, prefill_kernel: bool, tmp_path: Path) -> None:
    path = write_synthetic(tmp_path / f"{arch}.gguf", ARCH_SPECS[arch])
    device = "cuda" if CUDA else "cpu"
    ref = greedy_ids(path, "cpu", kernels=False, num_tokens=3)
    options = {"cuda_graphs": False, "prefill_kernel": prefill_kernel}
    assert greedy_ids(path, device, kernels=True, num_tokens=3, **options) == ref


@cuda_only
@pytest.mark.parametrize("layout", ["qwen2.5-0.5b-tiny", "qwen2.5-1.5b-tiny"])
def test_gpu_with_cuda_graphs_matches_cpu_reference(layout: str, tmp_path: Path) -> None:
    path = tmp_path / f"{layout}.gguf"
    write_layout(path, load_layout(layout), seed=0)
    ref = greedy_ids(path, "cpu", kernels=False, num_tokens=64)
    assert greedy_ids(path, "cuda", kernels=True, num_tokens=64) == ref
    assert greedy_ids(path, "cuda", kernels=True, num_tokens=64, cuda_graphs=False) == ref
    # Three tokens a step: one-token prefill chunks ride along with decodes (no logits due for them).
    tiny_steps = SchedulerConfig(max_num_batched_tokens=3)
    assert greedy_ids(path, "cuda", kernels=True, num_tokens=64, scheduler=tiny_steps) == ref
    # The paged prefill kernel (engine option, off by default until this passes on a GPU), chunked.
    chunks = SchedulerConfig(max_num_batched_tokens=24)
    assert greedy_ids(path, "cuda", kernels=True, num_tokens=64, prefill_kernel=True, scheduler=chunks) == ref


@cuda_only
@pytest.mark.parametrize("level", ["0", "1"])
def test_gpu_pdl_levels_match_cpu_reference(monkeypatch, level: str, tmp_path: Path) -> None:
    # 0: the graphs' kernels launched ordinarily; 1: PDL without the fp32 matvecs' weights prefetched
    # to L2 before the wait (the default, 2, runs in the test above): the same ids.
    path = tmp_path / "m.gguf"
    write_layout(path, load_layout("qwen2.5-0.5b-tiny"), seed=0)
    ref = greedy_ids(path, "cpu", kernels=False, num_tokens=64)
    # bf16 takes the int8 matvecs (Q4_K, Q6_K), which prefetch nothing: the same kernels at PDL 1 and 2.
    bf16 = greedy_ids(path, "cuda", kernels=True, num_tokens=64, dtype=torch.bfloat16)
    monkeypatch.setenv("STRATA_PDL", level)
    assert greedy_ids(path, "cuda", kernels=True, num_tokens=64) == ref
    assert greedy_ids(path, "cuda", kernels=True, num_tokens=64, cuda_graphs=False) == ref
    assert greedy_ids(path, "cuda", kernels=True, num_tokens=64, dtype=torch.bfloat16) == bf16


@cuda_only
def test_gpu_live_splits_match_cpu_reference(monkeypatch, tmp_path: Path) -> None:
    # STRATA_LIVE_SPLITS under captured graphs with PDL: the split count on the device, the split
    # kernel writing short contexts' outputs itself and the merge skipping them; the same ids.
    path = tmp_path / "m.gguf"
    write_layout(path, load_layout("qwen2.5-0.5b-tiny"), seed=0)
    ref = greedy_ids(path, "cpu", kernels=False, num_tokens=64)
    monkeypatch.setenv("STRATA_LIVE_SPLITS", "1")
    assert greedy_ids(path, "cuda", kernels=True, num_tokens=64) == ref


def tiny(tmp_path: Path, layout: str) -> Path:
    path = tmp_path / "m.gguf"
    write_layout(path, load_layout(layout), seed=0)
    return path


def bf16_ids(path: Path, **engine: object) -> list[list[int]]:
    """64 greedy tokens on the GPU in bf16 (where the int8 matvecs run for Q4_K and Q6_K)."""
    return greedy_ids(path, "cuda", kernels=True, num_tokens=64, dtype=torch.bfloat16, **engine)


@cuda_only
@pytest.mark.parametrize("setting", ["STRATA_Q4K_LAYOUT", "STRATA_Q6K_LAYOUT"])
def test_gpu_rows_layout_matches_cpu_reference(monkeypatch, tmp_path: Path, setting: str) -> None:
    # Q4_K's and Q6_K's "rows" layouts: fp32 x reads them with the planar / fp32 kernels through
    # `row_at` (the same sums: the reference's ids, graphs and eager); bf16's one-row steps take the rows
    # kernels, whose fp32 sums are reordered, so their ids are held to those of the layout the rows one
    # regroups (Q4_K's planar, Q6_K's blocks) for the first tokens only (a wrong kernel parts at once).
    # The 1.5B's layout has Q4_K and Q6_K weights.
    path = tiny(tmp_path, "qwen2.5-1.5b-tiny")
    ref = greedy_ids(path, "cpu", kernels=False, num_tokens=64)
    monkeypatch.setenv(setting, "blocks" if setting == "STRATA_Q6K_LAYOUT" else "planar")
    regrouped_bf16 = bf16_ids(path)
    monkeypatch.setenv(setting, "rows")
    assert greedy_ids(path, "cuda", kernels=True, num_tokens=64) == ref
    assert greedy_ids(path, "cuda", kernels=True, num_tokens=64, cuda_graphs=False) == ref
    rows_bf16 = bf16_ids(path)
    assert [ids[:4] for ids in rows_bf16] == [ids[:4] for ids in regrouped_bf16]


@cuda_only
def test_gpu_quantization_in_the_norm_keeps_the_tokens(monkeypatch, tmp_path: Path) -> None:
    # Graphs: the norms' int8 outputs are quantize_x's, bit for bit.
    path = tiny(tmp_path, "qwen2.5-1.5b-tiny")
    monkeypatch.setenv("STRATA_QUANT_IN_NORM", "0")
    expected = bf16_ids(path)
    monkeypatch.delenv("STRATA_QUANT_IN_NORM")  # the default: quantized in the norm
    assert bf16_ids(path) == expected


@cuda_only
def test_gpu_short_graphs_launch_as_eager(monkeypatch, tmp_path: Path) -> None:
    # The short set's own attention launch (16 splits of 64-position tiles in two stages) captured in
    # graphs gives the ids of the same launch run eagerly (the rule that picks the set is shared).
    path = tiny(tmp_path, "qwen2.5-0.5b-tiny")
    for name, value in (("GRAPHS", "2048"), ("SPLITS", "16"), ("BLOCK_T", "64"), ("STAGES", "2")):
        monkeypatch.setenv(f"STRATA_SHORT_{name}", value)
    assert bf16_ids(path) == bf16_ids(path, cuda_graphs=False)


@cuda_only
def test_gpu_concurrent_projections_keep_the_tokens(monkeypatch, tmp_path: Path) -> None:
    # STRATA_CONCURRENT_PROJECTIONS: the 1.5B layout's Q4_K q+k and Q6_K v (separate launches) on two
    # streams, parallel branches of the captured graphs, and eagerly; the same kernels: the same ids.
    import strata.layers.linear as linear

    path = tiny(tmp_path, "qwen2.5-1.5b-tiny")
    monkeypatch.setenv("STRATA_CONCURRENT_PROJECTIONS", "0")
    expected = bf16_ids(path)
    real, calls = linear._side_by_side, []
    monkeypatch.setattr(
        linear, "_side_by_side", lambda x, parts, norm: calls.append(len(parts)) or real(x, parts, norm)
    )
    monkeypatch.setenv("STRATA_CONCURRENT_PROJECTIONS", "1")
    assert bf16_ids(path) == expected
    assert calls and all(n >= 2 for n in calls)
    assert bf16_ids(path, cuda_graphs=False) == expected


def one_row_logits(monkeypatch, path: Path, **engine: object) -> tuple[list[int], list[torch.Tensor]]:
    """One prompt's 32 greedy tokens on the GPU in bf16 (every decode step one row) and the logits the
    sampler got at each step (steps one at a time: a run of decode steps takes its argmax on the device)."""
    import strata.engine.llm_engine as llm_engine

    monkeypatch.setenv("STRATA_DECODE_STEPS", "1")
    gguf = GGUFFile(path)
    model = build_model(gguf, ModelSpec.from_gguf(gguf), dtype=torch.bfloat16, device="cuda")
    e = LLMEngine(model, Tokenizer.from_gguf(gguf.metadata), EngineConfig(num_blocks=64, **engine))  # type: ignore[arg-type]
    logits: list[torch.Tensor] = []
    sample = llm_engine.sample_batch
    monkeypatch.setattr(
        llm_engine, "sample_batch", lambda lg, *a: logits.append(lg.clone()) or sample(lg, *a)
    )
    request = e.add_request(
        [(11 * j) % 200 + 3 for j in range(21)], SamplingParams(max_tokens=32, ignore_eos=True)
    )
    while e.has_unfinished():
        e.step()
    monkeypatch.setattr(llm_engine, "sample_batch", sample)
    return list(request.output_ids), logits


@cuda_only
def test_gpu_widen_to_stack_keeps_the_logits(monkeypatch, tmp_path: Path) -> None:
    # STRATA_WIDEN_TO_STACK: the 0.5B layout's layer 0 has Q5_0 q+k and a Q8_0 v, stacked into one
    # launch as Q8_0 (the same weights, each block's products summed in another order): the
    # prefill's logits within 5 % of their largest value of the layers as stored.
    path = tiny(tmp_path, "qwen2.5-0.5b-tiny")
    _, apart = one_row_logits(monkeypatch, path)
    monkeypatch.setenv("STRATA_WIDEN_TO_STACK", "1")
    _, stacked = one_row_logits(monkeypatch, path)
    scale = apart[0].abs().max().item()
    torch.testing.assert_close(stacked[0], apart[0], rtol=0, atol=0.05 * scale)
