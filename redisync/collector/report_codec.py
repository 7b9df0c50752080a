"""Reports through the mailbox's outbox, between a collector and its sidecar process.

The collector checks and encodes each key's payload once (`encode_reports`) and writes it as one
float64 vector tagged with the key's index in the schema; the sidecar publishes it as it came.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..store.schema import Encoded, Schema


class ReportCodec:
    """Reports through the outbox: each key's payload, checked and encoded once by the collector
    (`encode_reports`), as one float64 vector tagged with the key's index in the schema; the
    sidecar publishes it as it came (`Encoded`). The shared terms' parts get their shapes back here."""

    def __init__(self, schema: Schema):
        self.schema = schema
        self.names = list(schema.keys)
        self.index = {name: i for i, name in enumerate(self.names)}

    def encode(self, payloads: Mapping[str, bytes]) -> list[tuple[int, NDArray[np.float64]]]:
        """The payloads as tagged vectors for `Mailbox.write_vectors` (no copy: it copies them in)."""
        return [(self.index[name], np.frombuffer(payload, dtype="<f8")) for name, payload in payloads.items()]

    def decode(self, vectors: list[tuple[int, NDArray[Any]]]) -> dict[str, Encoded]:
        """The payloads back from the vectors `encode` made, as they were encoded."""
        return {self.names[tag]: Encoded(flat.astype("<f8", copy=False).tobytes()) for tag, flat in vectors}

    def shaped(self, name: str, part: str, flat: NDArray[Any]) -> Any:
        """A flat part in its key's shape (a number for a scalar part)."""
        spec = self.schema.keys[name]
        shape = next((s for p, s, _, _ in spec.payload_parts() if p == part), spec.shape)
        if flat.size == max(math.prod(shape), 1):  # another size stays flat: validation names the mismatch
            return float(flat[0]) if shape == () else flat.reshape(shape)
        return flat
