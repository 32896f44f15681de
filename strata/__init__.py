"""strata: run GGUF language models from Python."""

__version__ = "0.1.0"
