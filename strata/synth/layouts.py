"""Model layouts for synthetic GGUFs: tensor names, shapes and quant types of real models, no data.

A `Layout` is the architecture's hyper-parameters plus a quantization recipe. `plan_tensors` turns it
into the file's tensor table (in the order the real files list them) without touching any data, so
multi-GB layouts can be checked cheaply. A layout may also be read from a JSON file whose fields are
the `Layout` fields (see `load_layout`).

The `Q4_K_M` recipe is llama.cpp's (llama-quant.cpp, `llama_tensor_get_type`): Q4_K everywhere;
`output.weight` Q6_K; `attn_v` and `ffn_down` Q6_K where `use_more_bits` picks them; a K-quant whose
row is not a multiple of 256 falls back (Q4_K -> Q5_0, Q6_K -> Q8_0). llama.cpp counts `attn_v` (and a
dense model's `ffn_down`) in file order, and the real Qwen2.5 files list layers in string order
(blk.0, blk.1, blk.10, ...), so "layer index" in `use_more_bits` is the position in that order. This
reproduces every tensor type of the real 0.5B and 1.5B files (a test checks it).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from strata.synth.blocks import SUPPORTED_TYPES

_T = GGMLQuantizationType
ARCHITECTURES = ("qwen2", "qwen3", "qwen3moe", "llama")
RECIPES = ("Q4_K_M", *sorted(t.name for t in SUPPORTED_TYPES))
QWEN2_VOCAB = 151_936  # the shipped tokenizer's vocabulary


class LayoutError(ValueError):
    """A layout (built-in or JSON) that cannot describe a GGUF file; the message names the field."""


@dataclass(frozen=True)
class Layout:
    """One model's shape and quantization recipe; every size is in elements."""

    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    ffn_size: int  # dense FFN width (for MoE models the metadata value; expert_ffn_size is used)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int = QWEN2_VOCAB  # above the tokenizer's size, the vocabulary is padded with [PADn]
    context_length: int = 32_768
    rope_base: float = 1_000_000.0
    rms_eps: float = 1e-6
    tied_embeddings: bool = False
    num_experts: int = 0
    num_experts_used: int = 0
    expert_ffn_size: int = 0
    recipe: str = "Q4_K_M"  # llama.cpp's Q4_K_M mix, or one type name for every matrix
    overrides: tuple[tuple[str, str], ...] = ()  # (fnmatch pattern on tensor names, type): first wins

    def __post_init__(self) -> None:
        where = f"layout {self.name!r}"
        if self.architecture not in ARCHITECTURES:
            raise LayoutError(f"{where}: architecture {self.architecture!r} is not one of {ARCHITECTURES}")
        for f in ("num_layers", "hidden_size", "ffn_size", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, f) <= 0:
                raise LayoutError(f"{where}: {f} is {getattr(self, f)}; it must be positive")
        if self.num_heads % self.num_kv_heads:
            raise LayoutError(f"{where}: num_heads {self.num_heads} is not a multiple of num_kv_heads")
        if self.vocab_size < QWEN2_VOCAB:
            raise LayoutError(
                f"{where}: vocab_size {self.vocab_size} is below the tokenizer's {QWEN2_VOCAB} tokens"
            )
        if self.rms_eps <= 0 or self.rope_base <= 0 or self.context_length <= 0:
            raise LayoutError(f"{where}: rms_eps, rope_base and context_length must be positive")
        if self.recipe not in RECIPES:
            raise LayoutError(f"{where}: recipe {self.recipe!r} is not one of {', '.join(RECIPES)}")
        moe = self.architecture == "qwen3moe"
        for f in ("num_experts", "num_experts_used", "expert_ffn_size"):
            if moe and getattr(self, f) <= 0:
                raise LayoutError(f"{where}: {f} is required (positive) for architecture qwen3moe")
            if not moe and getattr(self, f):
                raise LayoutError(f"{where}: {f} is only for architecture qwen3moe")
        if self.num_experts_used > self.num_experts:
            raise LayoutError(f"{where}: num_experts_used {self.num_experts_used} > num_experts")
        for pattern, type_name in self.overrides:
            if type_name not in _TYPE_NAMES:
                raise LayoutError(f"{where}: overrides[{pattern!r}] type {type_name!r} is not supported")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["overrides"] = dict(self.overrides)
        return out


_TYPE_NAMES = {t.name: t for t in SUPPORTED_TYPES}


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of the file: GGUF name, torch-order shape (last dim contiguous), type, how to fill."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    role: str  # "weight" (RMS 1/sqrt(row)), "norm" (about 1.0) or "bias" (small)

    @property
    def num_blocks(self) -> int:
        block_size, _ = GGML_QUANT_SIZES[self.qtype]
        numel = 1
        for n in self.shape:
            numel *= n
        return numel // block_size

    @property
    def nbytes(self) -> int:
        return self.num_blocks * GGML_QUANT_SIZES[self.qtype][1]


def _layer_shapes(s: Layout) -> list[tuple[str, tuple[int, ...]]]:
    """One block's tensors in the order of their Hugging Face names, as converted files list them."""
    h, q, kv = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    norm = [("attn_norm.weight", (h,))]
    if s.is_moe:
        e, f = s.num_experts, s.expert_ffn_size
        ffn = [
            ("ffn_down_exps.weight", (e, h, f)),
            ("ffn_gate_exps.weight", (e, f, h)),
            ("ffn_up_exps.weight", (e, f, h)),
            ("ffn_gate_inp.weight", (e, h)),
        ]
    else:
        f = s.ffn_size
        ffn = [("ffn_down.weight", (h, f)), ("ffn_gate.weight", (f, h)), ("ffn_up.weight", (f, h))]
    qk_norm = s.architecture in ("qwen3", "qwen3moe")
    bias = s.architecture == "qwen2"
    attn: list[tuple[str, tuple[int, ...]]] = []
    for proj, rows in (("k", kv), ("output", h), ("q", q), ("v", kv)):
        if qk_norm and proj in ("k", "q"):
            attn.append((f"attn_{proj}_norm.weight", (s.head_dim,)))
        if bias and proj != "output":
            attn.append((f"attn_{proj}.bias", (rows,)))
        attn.append((f"attn_{proj}.weight", (rows, q if proj == "output" else h)))
    return [*norm, *ffn, ("ffn_norm.weight", (h,)), *attn]


def _names_and_shapes(s: Layout) -> list[tuple[str, tuple[int, ...]]]:
    # Hugging Face name order: lm_head, model.embed_tokens, model.layers.N (N as a string), model.norm.
    out: list[tuple[str, tuple[int, ...]]] = []
    if not s.tied_embeddings:
        out.append(("output.weight", (s.vocab_size, s.hidden_size)))
    out.append(("token_embd.weight", (s.vocab_size, s.hidden_size)))
    for layer in sorted(range(s.num_layers), key=str):
        out += [(f"blk.{layer}.{suffix}", shape) for suffix, shape in _layer_shapes(s)]
    out.append(("output_norm.weight", (s.hidden_size,)))
    return out


def _use_more_bits(i: int, n: int) -> bool:
    # llama.cpp: the first and last eighth of the layers, and every third one in between.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


_FALLBACK = {_T.Q2_K: _T.IQ4_NL, _T.Q3_K: _T.IQ4_NL, _T.Q4_K: _T.Q5_0, _T.Q5_K: _T.Q5_1, _T.Q6_K: _T.Q8_0}


def _fit(qtype: GGMLQuantizationType, row: int) -> GGMLQuantizationType:
    """llama.cpp's fallback for a type whose block does not divide the row."""
    if row % GGML_QUANT_SIZES[qtype][0]:
        qtype = _FALLBACK.get(qtype, _T.F16)
    return qtype if row % GGML_QUANT_SIZES[qtype][0] == 0 else _T.F16


def _recipe_types(s: Layout, tensors: list[tuple[str, tuple[int, ...]]]) -> list[GGMLQuantizationType]:
    q4_k_m = s.recipe == "Q4_K_M"
    base = _T.Q4_K if q4_k_m else _TYPE_NAMES[s.recipe]
    num_wv = sum(name.endswith("attn_v.weight") for name, _ in tensors)
    num_down = sum(".ffn_down" in name for name, _ in tensors)
    i_wv = i_down = 0
    out: list[GGMLQuantizationType] = []
    for name, shape in tensors:
        if len(shape) == 1 or name.endswith("ffn_gate_inp.weight"):
            out.append(_T.F32)  # llama.cpp never quantizes vectors or the MoE router
            continue
        qtype, row = base, shape[-1]
        is_output = name == "output.weight" or (s.tied_embeddings and name == "token_embd.weight")
        if q4_k_m and is_output:
            qtype = _T.Q8_0 if row % GGML_QUANT_SIZES[base][0] else _T.Q6_K
        elif q4_k_m and name.endswith("attn_v.weight"):
            qtype = _T.Q6_K if _use_more_bits(i_wv, num_wv) else base
        elif q4_k_m and ".ffn_down" in name:
            # MoE: llama.cpp reads the layer from the name (experts are not listed in layer order).
            layer = int(name.split(".")[1]) if s.is_moe else i_down
            qtype = _T.Q6_K if _use_more_bits(layer, num_down) else base
        i_wv += name.endswith("attn_v.weight")
        i_down += ".ffn_down" in name
        out.append(_fit(qtype, row))
    return out


def plan_tensors(s: Layout) -> list[TensorPlan]:
    """The file's tensor table in file order (no data is made)."""
    tensors = _names_and_shapes(s)
    plans = []
    for (name, shape), qtype in zip(tensors, _recipe_types(s, tensors), strict=True):
        role = "norm" if name.endswith("norm.weight") else "bias" if name.endswith(".bias") else "weight"
        if role == "weight":
            for pattern, type_name in s.overrides:
                if fnmatch.fnmatchcase(name, pattern):
                    qtype = _TYPE_NAMES[type_name]
                    break
            block = GGML_QUANT_SIZES[qtype][0]
            if shape[-1] % block:
                raise LayoutError(
                    f"layout {s.name!r}: overrides give {name} type {qtype.name}, but its rows of "
                    f"{shape[-1]} values are not a multiple of the {block}-value block"
                )
        plans.append(TensorPlan(name, shape, qtype, role))
    return plans


def _qwen2(name: str, **kw: Any) -> Layout:
    return Layout(name=name, architecture="qwen2", **kw)


# The real default model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M) and its 1.5B sibling; 7B and the MoE
# are the Hugging Face configs of Qwen2.5-7B-Instruct and Qwen3-30B-A3B. The tiny ones keep the
# architecture, the recipe and the type mix (hidden 128 is, like 896, not a multiple of 256, so the
# 0.5B-tiny falls back to Q5_0/Q8_0 like the 0.5B) with 2 layers and the real vocabulary.
BUILTIN_LAYOUTS: dict[str, Layout] = {
    s.name: s
    for s in (
        _qwen2("qwen2.5-0.5b", num_layers=24, hidden_size=896, ffn_size=4864, num_heads=14,
               num_kv_heads=2, head_dim=64),
        _qwen2("qwen2.5-1.5b", num_layers=28, hidden_size=1536, ffn_size=8960, num_heads=12,
               num_kv_heads=2, head_dim=128),
        _qwen2("qwen2.5-7b", num_layers=28, hidden_size=3584, ffn_size=18944, num_heads=28,
               num_kv_heads=4, head_dim=128, vocab_size=152_064),
        Layout("qwen3-30b-a3b", "qwen3moe", num_layers=48, hidden_size=2048, ffn_size=6144,
               num_heads=32, num_kv_heads=4, head_dim=128, context_length=40_960, num_experts=128,
               num_experts_used=8, expert_ffn_size=768),
        _qwen2("qwen2.5-0.5b-tiny", num_layers=2, hidden_size=128, ffn_size=256, num_heads=2,
               num_kv_heads=1, head_dim=64),
        _qwen2("qwen2.5-1.5b-tiny", num_layers=2, hidden_size=256, ffn_size=512, num_heads=2,
               num_kv_heads=1, head_dim=128),
        _qwen2("qwen2.5-7b-tiny", num_layers=2, hidden_size=256, ffn_size=512, num_heads=4,
               num_kv_heads=2, head_dim=64, vocab_size=152_064),
        # 16 experts, not 8: llama.cpp's recipe special-cases exactly 8 experts.
        Layout("qwen3-30b-a3b-tiny", "qwen3moe", num_layers=2, hidden_size=256, ffn_size=512,
               num_heads=4, num_kv_heads=2, head_dim=128, context_length=40_960, num_experts=16,
               num_experts_used=4, expert_ffn_size=256),
    )
}  # fmt: skip


_FIELDS = {f.name: f for f in dataclasses.fields(Layout)}
_REQUIRED = [f.name for f in dataclasses.fields(Layout) if f.default is dataclasses.MISSING]


def layout_from_json(obj: Mapping[str, Any], default_name: str = "custom") -> Layout:
    """A `Layout` from a JSON object whose keys are `Layout`'s field names.

    Required: architecture, num_layers, hidden_size, ffn_size, num_heads, num_kv_heads, head_dim.
    Optional: name (default: the file's stem), vocab_size, context_length, rope_base, rms_eps,
    tied_embeddings, num_experts, num_experts_used, expert_ffn_size (the three for qwen3moe), recipe
    ("Q4_K_M" or a type name such as "Q8_0"), overrides ({"blk.*.attn_q.weight": "Q8_0", ...}).
    """
    if not isinstance(obj, Mapping):
        raise LayoutError(f"a layout must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name", default_name)
    where = f"layout {name!r}"
    unknown = sorted(set(obj) - set(_FIELDS))
    if unknown:
        raise LayoutError(f"{where}: unknown field {unknown[0]!r}; the fields are {', '.join(_FIELDS)}")
    missing = [f for f in _REQUIRED if f not in obj and f != "name"]
    if missing:
        raise LayoutError(f"{where}: field {missing[0]!r} is required")
    values: dict[str, Any] = {"name": name}
    for key, value in obj.items():
        values[key] = _check_type(where, key, value)
    return Layout(**values)


def _check_type(where: str, key: str, value: Any) -> Any:
    default = _FIELDS[key].default
    kind = type(default) if default is not dataclasses.MISSING else None
    if key in ("name", "architecture", "recipe") or kind is str:
        ok, want = isinstance(value, str), "a string"
    elif key == "overrides":
        ok = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        if ok:
            return tuple(value.items())
        want = 'an object of {"pattern": "TYPE"}'
    elif kind is bool:
        ok, want = isinstance(value, bool), "true or false"
    elif kind is float:
        ok, want = isinstance(value, int | float) and not isinstance(value, bool), "a number"
        value = float(value) if ok else value
    else:
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    if not ok:
        raise LayoutError(f"{where}: field {key!r} must be {want}, got {value!r}")
    return value


def load_layout(spec: str) -> Layout:
    """A built-in layout's name, or the path of a JSON layout file."""
    if spec in BUILTIN_LAYOUTS:
        return BUILTIN_LAYOUTS[spec]
    path = Path(spec).expanduser()
    if not path.is_file():
        known = ", ".join(BUILTIN_LAYOUTS)
        raise LayoutError(f"{spec!r} is neither a built-in layout ({known}) nor a JSON file")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LayoutError(f"{path}: not valid JSON ({e})") from None
    return layout_from_json(obj, default_name=path.stem)
