"""What `strata tokenize` shows: each token of a prompt with its id, text and origin."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.prompt.safe_encode import EncodedPrompt
from strata.prompt.tokenizer import Tokenizer


@dataclass(frozen=True)
class TokenRows:
    """Parallel lists, one entry per token (the `--json` shape)."""

    ids: list[int]
    pieces: list[str]
    special: list[bool]
    plain: list[bool]

    @classmethod
    def of(cls, tokenizer: Tokenizer, encoded: EncodedPrompt) -> TokenRows:
        return cls(
            ids=list(encoded.ids),
            pieces=[tokenizer.id_to_piece(i) for i in encoded.ids],
            special=[tokenizer.is_special(i) for i in encoded.ids],
            plain=list(encoded.plain),
        )

    def to_json(self) -> str:
        return json.dumps(
            {"ids": self.ids, "pieces": self.pieces, "special": self.special, "plain": self.plain},
            ensure_ascii=False,
        )

    def table(self, tokenizer: Tokenizer) -> list[str]:
        lines = [f"{'#':>5} {'id':>7}  {'text':<28} {'piece':<28} origin"]
        for n, (i, piece, special, plain) in enumerate(
            zip(self.ids, self.pieces, self.special, self.plain, strict=True)
        ):
            origin = "special" if special else "plain" if plain else "trusted"
            text = repr(tokenizer.decode([i]))
            lines.append(f"{n:>5} {i:>7}  {text:<28} {piece!r:<28} {origin}")
        num_special, num_plain = sum(self.special), sum(self.plain)
        lines.append(f"{len(self.ids)} tokens: {num_special} special, {num_plain} from plain spans")
        return lines


def load_chat(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """A JSON file holding OpenAI-style messages: a list, or an object with "messages" (and "tools")."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--chat {path}: cannot read it as JSON ({e})") from None
    if isinstance(data, list):
        return data, None
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        tools = data.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ValueError(f'--chat {path}: "tools" must be a list of tool definitions')
        return data["messages"], tools
    raise ValueError(f'--chat {path}: expected a list of messages or an object with a "messages" list')
