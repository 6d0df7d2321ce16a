"""One stored memory of a Mem0 vector store, and the canonical text of its payload."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

__all__ = ["Point", "payload_json"]


@dataclass
class Point:
    """One stored memory: ``vector`` (D,) float32, ``payload`` as stored, ``sparse``: extra
    named sparse vectors (Qdrant's ``bm25``) as ``{name: {"indices": [...], "values": [...]}}``."""

    id: str
    vector: np.ndarray
    payload: dict
    sparse: dict | None = None


def payload_json(payload: dict, *, sort_keys: bool = False) -> str:
    """The canonical text of a payload: JSON, key order kept (or sorted), non-ASCII kept."""
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, sort_keys=sort_keys)
