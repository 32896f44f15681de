"""transformers' own GGUF loader as the independent reference (it dequantizes to float32)."""

from __future__ import annotations

from pathlib import Path

import torch


def load_hf_model(path: Path) -> torch.nn.Module:
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()


@torch.inference_mode()
def hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0].float()


@torch.inference_mode()
def hf_greedy(model: torch.nn.Module, ids: list[int], num_tokens: int, eos_ids: frozenset[int]) -> list[int]:
    out = model.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=num_tokens,
        do_sample=False,
        eos_token_id=sorted(eos_ids),
        pad_token_id=sorted(eos_ids)[0],
    )[0, len(ids) :].tolist()
    return out[: next((i for i, t in enumerate(out) if t in eos_ids), len(out))]
