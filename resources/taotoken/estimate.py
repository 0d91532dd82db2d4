"""Token estimates that are safe for a budget, and the response-cache key.

No tokenizer ships in the installed packages (and nothing is downloaded), so the estimate is an upper
bound built from the text itself: the larger of a BPE-shaped count (words, digit groups, punctuation) and
half the UTF-8 bytes (BPE vocabularies average 3-4 bytes a token on English and code; 2 bytes a token
covers JSON-heavy and non-Latin text), plus the chat template's framing per message. Settlement records
the server's real count; a server that reports more than this estimate is an overshoot, which blocks
the sweep's later calls (resources/ledger.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping, Sequence

_PIECE = re.compile(r"[A-Za-z]+|\d+|\s+|[^\sA-Za-z\d]")
FRAMING_PER_MESSAGE = 6  # role, start/end markers of a chat template
FRAMING_PER_REQUEST = 6  # begin-of-text, the assistant header


def _pieces(text: str) -> int:
    n = 0
    for m in _PIECE.finditer(text):
        s = m.group()
        c = s[0]
        if c.isascii() and c.isalpha():
            n += 1 + (len(s) - 1) // 6
        elif c.isascii() and c.isdigit():
            n += (len(s) + 2) // 3
        elif c.isspace():
            n += 1 if len(s) > 1 else 0
        else:
            n += 2 if ord(c) >= 0x2E80 else 1
    return n


def estimate_tokens(text: str) -> int:
    """An upper bound on the tokens of ``text`` for BPE tokenizers: max(BPE-shaped count, ceil(UTF-8 bytes / 2))."""
    text = text or ""
    return max(_pieces(text), (len(text.encode("utf-8")) + 1) // 2)


def estimate_messages_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Prompt tokens of a chat request: each message's content plus the template's framing."""
    return sum(FRAMING_PER_MESSAGE + estimate_tokens(str(m.get("content") or "")) for m in messages) + FRAMING_PER_REQUEST


def request_hash(model: str, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]) -> str:
    """Cache key: the model, the messages and the parameters that change the answer (never a key)."""
    blob = json.dumps({"v": 1, "model": model, "messages": list(messages), "params": dict(params)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
