"""The engine: KV storage, sampling and the generation loop."""
