"""Regenerate strata/synth/qwen2_tokenizer.json.gz from the real default model.

    python benchmarks/extract_tokenizer.py [--model qwen2.5-coder-0.5b]

Copies every `tokenizer.*` metadata key (vocabulary, token types, merges, special ids, add_bos, chat
template) with its GGUF value type; `strata synth` writes them into every synthetic file. Run it when
the default model changes; tests/test_synth_layouts.py checks the shipped file against the model.
"""

from __future__ import annotations

import argparse

from strata.model_store import DEFAULT_MODEL, resolve_model
from strata.synth.tokenizer_meta import load_tokenizer_metadata, refresh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a packaged model name or a GGUF path")
    args = parser.parse_args()
    path = refresh(resolve_model(args.model))
    meta = load_tokenizer_metadata()
    tokens = len(meta["tokenizer.ggml.tokens"].value)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB): {len(meta)} keys, {tokens} tokens")


if __name__ == "__main__":
    main()
