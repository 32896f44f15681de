"""Which kernels one decode step launches, counted on the CPU: the plan for fusing launches away.

    python benchmarks/step_launches.py [--layout qwen2.5-0.5b-tiny] [--dtype bfloat16] [--steps 2]
        [--env STRATA_ACT_IN_QUANT=1 ...]

A decode step on the GPU is one CUDA graph whose nodes are every kernel the step launches: the
Triton kernels and the torch operations between them (casts, copies, index ops, the sampler). On a
small model the step is bound by how many there are (GPU.md: the 0.5B's ~300 launches), so this lists
them. The model (a synthetic one in a real layout) runs on the kernel path in Triton's interpreter on
CPU tensors (STRATA_TRITON_ON_CPU=1), through the engine as a GPU run takes it but without graphs;
each decode step's Triton launches are counted by kernel name (a hook on the interpreter's launch),
and its torch operations by `torch.profiler` (CPU activity; operations that only make views, which
launch nothing on a GPU, are left out). The layout runs at one and at two layers: the difference is
the per-layer count, from which the total for --layers layers follows.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
os.environ["STRATA_TRITON_ON_CPU"] = "1"

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from strata.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from strata.engine.sampler import SamplingParams  # noqa: E402
from strata.gguf.reader import GGUFFile  # noqa: E402
from strata.gguf.spec import ModelSpec  # noqa: E402
from strata.models import build_model  # noqa: E402
from strata.prompt.tokenizer import Tokenizer  # noqa: E402
from strata.synth.layouts import load_layout  # noqa: E402
from strata.synth.writer import write_layout  # noqa: E402

# Operations that only make views or metadata: no kernel on a GPU.
VIEW_OPS = {
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::slice", "aten::select", "aten::as_strided",
    "aten::t", "aten::transpose", "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::expand",
    "aten::split", "aten::split_with_sizes", "aten::narrow", "aten::detach", "aten::alias", "aten::empty",
    "aten::empty_strided", "aten::empty_like", "aten::resize_", "aten::unbind", "aten::flatten",
    "aten::lift_fresh", "aten::item", "aten::_local_scalar_dense", "aten::result_type", "aten::to",
    "aten::_to_copy", "aten::chunk", "aten::contiguous", "aten::numpy_T", "aten::view_as",
    "aten::is_nonzero", "aten::size", "aten::stride", "aten::dim", "aten::set_",
}  # fmt: skip


@dataclasses.dataclass
class Step:
    triton: Counter[str]
    torch: Counter[str]


def count_steps(path: Path, dtype: torch.dtype, steps: int) -> Step:
    """The Triton and torch launches of the last of `steps` decode steps of one sequence."""
    gguf = GGUFFile(path)
    model = build_model(gguf, ModelSpec.from_gguf(gguf), dtype=dtype, device="cpu")
    assert model.place.kernels, "the kernel path did not engage (STRATA_TRITON_ON_CPU)"
    config = EngineConfig(num_blocks=16, cuda_graphs=False)
    engine = LLMEngine(model, Tokenizer.from_gguf(gguf.metadata), config)
    engine.add_request(list(range(3, 12)), SamplingParams(max_tokens=steps + 1, ignore_eos=True))
    engine.step()  # the prefill
    launches: Counter[str] = Counter()
    real_call = interpreter.GridExecutor.__call__

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        launches[self.fn.__name__] += 1
        # The interpreter's own torch calls (argument copies) nest under this range: not counted.
        with torch.profiler.record_function(f"triton::{self.fn.__name__}"):
            return real_call(self, *args, **kwargs)

    ops: Counter[str] = Counter()
    interpreter.GridExecutor.__call__ = counted  # type: ignore[method-assign]
    try:
        for _ in range(steps):  # the last step's counts are kept (caches warm by then)
            launches.clear()
            ops.clear()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                engine.step()
            for event in prof.events():
                # Top-level aten ops only: a composite op's own children would count twice.
                top = event.cpu_parent is None
                if top and event.name.startswith("aten::") and event.name not in VIEW_OPS:
                    ops[event.name] += 1
    finally:
        interpreter.GridExecutor.__call__ = real_call  # type: ignore[method-assign]
    return Step(Counter(launches), Counter(ops))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layout", default="qwen2.5-0.5b-tiny")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--layers", type=int, default=24, help="the depth to total for (the 0.5B's 24)")
    p.add_argument("--env", nargs="*", default=[], help="NAME=VALUE settings, e.g. STRATA_ACT_IN_QUANT=1")
    args = p.parse_args()
    for setting in args.env:
        name, _, value = setting.partition("=")
        os.environ[name] = value
    dtype = getattr(torch, args.dtype)
    layout = load_layout(args.layout)
    counts = {}
    with tempfile.TemporaryDirectory() as folder:
        for layers in (1, 2):
            path = Path(folder) / f"{layers}.gguf"
            write_layout(path, dataclasses.replace(layout, num_layers=layers), seed=0)
            counts[layers] = count_steps(path, dtype, args.steps)
    print(f"{args.layout} at 1 and 2 layers, {args.dtype}, settings {args.env or 'default'}")
    # Layers may differ in quant types (a recipe's "more bits" layers), so a kernel's count can move
    # between names from one depth to the next; the totals do not.
    print(f"{'launch':60} {'1 layer':>8} {'2 layers':>8}")
    sums = [0, 0]
    for kind in ("triton", "torch"):
        one, two = getattr(counts[1], kind), getattr(counts[2], kind)
        for name in sorted(set(one) | set(two)):
            sums[0] += one[name]
            sums[1] += two[name]
            print(f"{kind + ' ' + name:60} {one[name]:8} {two[name]:8}")
    per_layer, once = sums[1] - sums[0], 2 * sums[0] - sums[1]
    print(f"{'total':60} {sums[0]:8} {sums[1]:8}")
    print(f"per layer {per_layer}, once per step {once}: with {args.layers} layers "
          f"{per_layer * args.layers + once} launches per decode step")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
