"""A human-readable summary of a GGUF file, for `strata info`."""

from __future__ import annotations

import math
from collections import Counter

from strata.gguf.reader import GGUFFile
from strata.gguf.spec import ModelSpec


def summarize(gguf: GGUFFile, spec: ModelSpec) -> list[tuple[str, str]]:
    """(label, value) rows: architecture, sizes, context, quant-type histogram, chat template."""
    num_params = sum(math.prod(t.shape) for t in gguf.tensors.values())
    histogram = Counter(t.qtype.name for t in gguf.tensors.values())
    quant = ", ".join(f"{name} {count}" for name, count in histogram.most_common())
    template = gguf.metadata.get("tokenizer.chat_template")
    rows = [
        ("file", f"{gguf.path} ({gguf.path.stat().st_size / 2**20:,.1f} MiB, GGUF v{gguf.version})"),
        ("name", str(gguf.metadata.get("general.name", "?"))),
        ("architecture", spec.architecture),
        ("parameters", f"{num_params / 1e6:,.1f} M in {len(gguf.tensors)} tensors"),
        ("layers", str(spec.num_layers)),
        ("hidden / ffn", f"{spec.hidden_size} / {spec.ffn_size}"),
        ("heads / kv heads / head dim", f"{spec.num_heads} / {spec.num_kv_heads} / {spec.head_dim}"),
        ("vocabulary", f"{spec.vocab_size:,} ({gguf.metadata.get('tokenizer.ggml.model', '?')})"),
        ("context", f"{spec.context_length:,} tokens"),
        ("rope", f"base {spec.rope_base:g}, dim {spec.rope_dim}, {spec.rope_layout}"),
        ("tied embeddings", "yes" if spec.tied_embeddings else "no"),
        ("quant types", quant),
        ("chat template", f"yes ({len(template):,} chars)" if template else "no"),
    ]
    if spec.sliding_window:
        rows.insert(9, ("sliding window", f"{spec.sliding_window} on {sum(spec.sliding_layers)} layers"))
    return rows
