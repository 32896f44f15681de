"""benchmarks/weight_traffic.py: the kernel named for each packed weight is the one quant_matvec
launches for one row of bf16 x (recorded in the interpreter), every distinct weight is counted once,
and the bandwidth lines divide bytes by time against the ceiling."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before any kernel module is imported (see test_kernels_quant_matvec)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

triton = pytest.importorskip("triton")

from benchmarks.weight_traffic import bandwidth_lines, bytes_by_kernel, matvec_kernel  # noqa: E402
from strata.kernels.quant_matvec import quant_matvec  # noqa: E402
from strata.kernels.quant_pack import pack_quant_weight  # noqa: E402
from tests.test_kernels_quant_matvec import DEVICE, T, k_for, random_weight  # noqa: E402

CASES = [  # (type, layout, q6k_layout)
    (T.Q8_0, None, "blocks"), (T.Q5_0, None, "blocks"), (T.Q4_K, "planar", "blocks"),
    (T.Q4_K, "rows", "blocks"), (T.Q4_K, "blocks", "blocks"), (T.Q6_K, None, "rows"),
    (T.Q6_K, None, "blocks"), (T.Q4_0, None, "blocks"),
]  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="records launches through the interpreter")
@pytest.mark.parametrize("qtype,layout,q6k_layout", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_named_kernel_is_the_one_launched(monkeypatch, qtype, layout, q6k_layout):
    from triton.runtime.interpreter import InterpretedFunction

    launched: list[str] = []
    run = InterpretedFunction.run

    def record(self, *args, **kwargs):
        launched.append(self.fn.__name__)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", record)
    n, k = 70, k_for(qtype, 2)
    raw = random_weight(qtype, n, k, seed=3).to(DEVICE)
    w = pack_quant_weight(raw, qtype, n, k, layout, q6k_layout=q6k_layout)
    quant_matvec(torch.randn(1, k, device=DEVICE).bfloat16(), w, qtype, n, k)
    matvecs = [name for name in launched if "matvec" in name]
    assert matvecs == [matvec_kernel(w)], launched


def test_bytes_count_each_weight_once():
    k = k_for(T.Q5_0, 2)
    a = pack_quant_weight(random_weight(T.Q5_0, 40, k, seed=1), T.Q5_0, 40, k)
    b = pack_quant_weight(random_weight(T.Q8_0, 24, k, seed=2), T.Q8_0, 24, k)
    read = bytes_by_kernel([a, b, a])  # a twice: a tied head holds the embedding's planes
    assert read == {"legacy_int8_matvec_kernel": a.nbytes + b.nbytes}  # both on int8 x (STRATA_INT8_X)
    assert a.nbytes == 40 * k // 32 * 22


def test_bandwidth_lines():
    lines = bandwidth_lines({"a": 2.0, "b": 1.0}, {"a": 1_000_000, "b": 3_000_000, "c": 5}, 2000.0)
    assert lines[0] == "weights read a step, by kernel (copy ceiling 2,000 GB/s):"
    # name, us, "us", MB, "MB", GB/s, "GB/s", fraction of the ceiling; the most bytes first
    fields = [line.split() for line in lines[1:]]
    assert [(f[0], f[1], f[3], f[5], f[7]) for f in fields] == [
        ("b", "1.0", "3.0", "3000", "150.0%"),
        ("a", "2.0", "1.0", "500", "25.0%"),
        ("c", "0.0", "0.0", "nan", "nan%"),  # no time recorded for it
    ]


def test_a_models_weights_are_each_counted(tmp_path, monkeypatch):
    # The tiny 0.5B layout on the kernel path (Triton's interpreter): its QuantLinear layers' packed
    # weights (q, k and v stacked where their types match) hold every projection and the untied output
    # head, as many bytes as the file's (Q4_K's planar planes 148 for its 144), the embedding not.
    from strata.gguf.reader import GGUFFile
    from strata.gguf.spec import ModelSpec
    from strata.layers.linear import QuantLinear
    from strata.models import build_model
    from strata.synth.layouts import load_layout
    from strata.synth.writer import write_layout

    monkeypatch.setenv("STRATA_TRITON_ON_CPU", "1")
    path = tmp_path / "m.gguf"
    write_layout(path, load_layout("qwen2.5-0.5b-tiny"), seed=0)
    gguf = GGUFFile(path)
    model = build_model(gguf, ModelSpec.from_gguf(gguf), dtype=torch.bfloat16, device=DEVICE)
    packed = [m.packed for m in model.modules() if isinstance(m, QuantLinear) and m.packed is not None]
    read = bytes_by_kernel(packed)
    want = 0
    for t in gguf.tensors.values():
        if len(t.shape) == 2 and t.name != "token_embd.weight" and t.qtype not in (T.F32, T.F16, T.BF16):
            want += t.nbytes * 148 // 144 if t.qtype == T.Q4_K else t.nbytes
    assert sum(read.values()) == want
    head = gguf.tensors["output.weight"]
    assert head.qtype == T.Q8_0 and read["legacy_int8_matvec_kernel"] >= head.nbytes
