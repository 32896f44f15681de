"""The default model's tokenizer metadata, shipped with the package so synthetic files need no model.

`qwen2_tokenizer.json.gz` holds every `tokenizer.*` key of Qwen2.5-Coder-0.5B-Instruct (vocabulary,
token types, merges, special ids, chat template) with its GGUF value type, so a synthetic GGUF gets
byte-for-byte the real metadata. `refresh()` (run by benchmarks/extract_tokenizer.py) rebuilds it from
the real file.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gguf.constants import GGUFValueType

TOKENIZER_FILE = Path(__file__).with_name("qwen2_tokenizer.json.gz")
_PREFIX = "tokenizer."


@dataclass(frozen=True)
class MetaValue:
    """One GGUF metadata value with its stored type (`item_type` for arrays)."""

    type: GGUFValueType
    value: Any
    item_type: GGUFValueType | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type.name, "value": self.value}
        if self.item_type is not None:
            out["item_type"] = self.item_type.name
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> MetaValue:
        item = obj.get("item_type")
        return cls(GGUFValueType[obj["type"]], obj["value"], GGUFValueType[item] if item else None)


def extract_tokenizer_metadata(gguf_path: str | Path) -> dict[str, MetaValue]:
    """Every `tokenizer.*` key of a GGUF file, with its value type, in file order."""
    from gguf import GGUFReader  # slow to parse big vocabularies, so only when refreshing

    out: dict[str, MetaValue] = {}
    for field in GGUFReader(str(gguf_path)).fields.values():
        if not field.name.startswith(_PREFIX):
            continue
        item = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        out[field.name] = MetaValue(field.types[0], field.contents(), item)
    return out


def refresh(gguf_path: str | Path, out: Path = TOKENIZER_FILE) -> Path:
    """Rewrite the shipped file from a real GGUF (reproducibly: no timestamp in the gzip header)."""
    meta = extract_tokenizer_metadata(gguf_path)
    doc = {"source": Path(gguf_path).name, "metadata": {k: v.to_json() for k, v in meta.items()}}
    data = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(data)
    load_tokenizer_metadata.cache_clear()
    return out


@cache
def load_tokenizer_metadata() -> dict[str, MetaValue]:
    """The shipped tokenizer metadata (read once per process)."""
    with gzip.open(TOKENIZER_FILE, "rb") as f:
        doc = json.loads(f.read().decode("utf-8"))
    return {key: MetaValue.from_json(obj) for key, obj in doc["metadata"].items()}
