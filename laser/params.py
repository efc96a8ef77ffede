"""Decoder parameters as one canonical string: the decoder-cache key of a worker and the stored
``decoder_params`` column."""
from __future__ import annotations

import json
from typing import Any, Mapping


def encode_params(params: Mapping[str, Any]) -> str:
    """``params`` as canonical JSON: keys sorted, no spaces."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"))
