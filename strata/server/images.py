"""Images sent to a text-only model: dropped with a warning (the default) or refused, per model config.

A dropped image leaves its message's text; the response says what was dropped (the `X-Strata-Warning`
header, and a `warnings` field in non-streamed bodies), so a client is never silently misread.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from strata.server.errors import bad_request

logger = logging.getLogger(__name__)

# OpenAI content part types that carry pictures or files rather than text.
_NON_TEXT_PARTS = frozenset({"image_url", "input_image", "image", "file", "input_file", "input_audio"})


def refused(where: str, kind: str) -> Exception:
    return bad_request(
        f"{where} is {kind}, but this model has no vision and its config refuses images "
        '("images": "refuse"); send the content as text',
        "messages",
    )


def dropped_warning(count: int) -> str:
    noun = "part" if count == 1 else "parts"
    return f"dropped {count} image/file content {noun}: this model reads text only"


def strip_images(
    messages: list[dict[str, Any]], policy: Literal["drop", "refuse"]
) -> tuple[list[dict[str, Any]], list[str]]:
    """OpenAI-shaped messages without image parts, and the warnings to send back."""
    out, count = [], 0
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        kept = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in _NON_TEXT_PARTS:
                if policy == "refuse":
                    raise refused(f"message {i}, content part {j}", f"an {kind} part")
                count += 1
                continue
            kept.append(part)
        out.append({**message, "content": kept} if len(kept) != len(content) else message)
    return out, note_dropped(count)


def note_dropped(count: int) -> list[str]:
    """The warnings for `count` dropped parts (logged too)."""
    if not count:
        return []
    warning = dropped_warning(count)
    logger.warning(warning)
    return [warning]


def warning_headers(warnings: list[str]) -> dict[str, str]:
    return {"X-Strata-Warning": "; ".join(warnings)} if warnings else {}
