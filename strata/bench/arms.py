"""What one arm of a comparison is: `KIND[@REV][:key=value,...]`, e.g. `strata`, `strata@HEAD~1`,
`strata:threads=1`, `llamacpp:n_batch=256`, `transformers`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The options each kind understands; every kind also takes `threads` and `model` (another GGUF file).
# strata arm options that set its environment knobs (strata/env.py).
ENV_OPTIONS = {
    "q4k_layout": "STRATA_Q4K_LAYOUT",
    "q6k_layout": "STRATA_Q6K_LAYOUT",
    "matvec_rows": "STRATA_MATVEC_ROWS",
    "dense_rows": "STRATA_DENSE_ROWS",
    "copy_rows": "STRATA_COPY_ROWS",
    "int8_x": "STRATA_INT8_X",  # types joined by "+", e.g. int8_x=Q4_K+Q6_K
    "act_in_quant": "STRATA_ACT_IN_QUANT",
    "pdl": "STRATA_PDL",
    "quant_in_norm": "STRATA_QUANT_IN_NORM",
    "live_splits": "STRATA_LIVE_SPLITS",
    "max_splits": "STRATA_MAX_SPLITS",
    "concurrent_projections": "STRATA_CONCURRENT_PROJECTIONS",
    "dense_copy": "STRATA_DENSE_COPY",
    "dense_wide": "STRATA_DENSE_WIDE",
    "dense_stack": "STRATA_DENSE_STACK",
    "short_graphs": "STRATA_SHORT_GRAPHS",
    "short_splits": "STRATA_SHORT_SPLITS",
    "short_block_t": "STRATA_SHORT_BLOCK_T",
    "short_stages": "STRATA_SHORT_STAGES",
    "decode_steps": "STRATA_DECODE_STEPS",
    "split_programs": "STRATA_SPLIT_PROGRAMS",
    "attn_block_t": "STRATA_ATTN_BLOCK_T",
    "attn_warps": "STRATA_ATTN_WARPS",
    "attn_stages": "STRATA_ATTN_STAGES",
    "split_len": "STRATA_SPLIT_LEN",
    "widen_to_stack": "STRATA_WIDEN_TO_STACK",
    "matvec_preload": "STRATA_MATVEC_PRELOAD",
    "quant_in_merge": "STRATA_QUANT_IN_MERGE",
    "rope_in_matvec": "STRATA_ROPE_IN_MATVEC",
    "attention_prefetch": "STRATA_ATTENTION_PREFETCH",
    "merge_warps": "STRATA_MERGE_WARPS",
    "rows_preload": "STRATA_ROWS_PRELOAD",
    "q6k_halves": "STRATA_Q6K_HALVES",
    "int8_lane_blocks": "STRATA_INT8_LANE_BLOCKS",
    "split_one_step": "STRATA_SPLIT_ONE_STEP",
}

OPTIONS: dict[str, frozenset[str]] = {
    "strata": frozenset(
        {
            "threads",
            "model",
            "dtype",
            "block_size",
            "max_batched_tokens",
            "prefix_cache",
            "cuda_graphs",
            "prefill_kernel",
            "prefill_graphs",
            "tensor_parallel",
            *ENV_OPTIONS,
        }
    ),
    "llamacpp": frozenset({"threads", "model", "n_batch"}),
    "transformers": frozenset({"threads", "model", "dtype"}),
}


@dataclass(frozen=True)
class ArmSpec:
    kind: str
    rev: str | None = None  # a git revision (strata only); None is the working tree
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in OPTIONS:
            raise ValueError(f"arm kind {self.kind!r} is unknown; use one of {', '.join(OPTIONS)}")
        if self.rev is not None and self.kind != "strata":
            raise ValueError(f"{self.kind}@{self.rev}: only strata arms can name a git revision")
        unknown = sorted(set(self.options) - OPTIONS[self.kind])
        if unknown:
            known = ", ".join(sorted(OPTIONS[self.kind]))
            raise ValueError(f"arm {self.kind}: unknown option {', '.join(unknown)}; it takes {known}")

    @classmethod
    def parse(cls, text: str) -> ArmSpec:
        head, _, opts = text.partition(":")
        kind, _, rev = head.partition("@")
        options: dict[str, str] = {}
        for item in filter(None, opts.split(",")):
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise ValueError(f"arm {text!r}: option {item!r} is not key=value")
            options[key.strip()] = value.strip()
        return cls(kind.strip(), rev.strip() or None, options)

    def __str__(self) -> str:
        text = self.kind + (f"@{self.rev}" if self.rev else "")
        return text + (":" + ",".join(f"{k}={v}" for k, v in self.options.items()) if self.options else "")

    @property
    def arithmetic(self) -> tuple[Any, ...]:
        """Arms with equal keys compute the same float operations, so greedy ids must match exactly.

        Thread counts and batching options are assumed not to change the arithmetic (each output is
        still one reduction in one order); a test or `--gate self` says otherwise when they do."""
        return (self.kind, self.options.get("dtype", "float32"))
