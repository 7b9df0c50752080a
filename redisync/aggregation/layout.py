"""Where the sub-runs of a split run live: each in its own Cluster slot, spread over the primaries.

A run's keys share its name as their hash tag, so a sub-run's name decides its slot and so its
primary. The names are ``<run>.<j>``, with a suffix ``.<n>`` where a Cluster's slot map would
otherwise put two sub-runs on one primary while another has fewer (round-robin over the primaries
in address order, as the client's slot map has them when the split is made).
"""

from __future__ import annotations

from ..store.client import Store

MAX_SUFFIX = 100_000


def subrun_names(store: Store, count: int, on: list[str] | None = None) -> list[str]:
    """Names for ``count`` sub-runs of ``store``'s run, placed round-robin over a Cluster's primaries
    (or over those of ``on``, host:port)."""
    primaries = on or store.primaries()
    names = []
    for j in range(count):
        base = f"{store.run}.{j}"
        if not primaries:
            names.append(base)
            continue
        want = primaries[j % len(primaries)]
        for n in range(MAX_SUFFIX):
            name = base if n == 0 else f"{base}.{n}"
            if store.primary_of(name) == want:
                names.append(name)
                break
        else:  # (a Cluster whose primary serves almost no slots)
            names.append(base)
    return names


def split(store: Store, count: int, on: list[str] | None = None) -> list[str]:
    """Split ``store``'s run into ``count`` sub-runs (or find the split in force): their names. On a
    Cluster they spread over its primaries (over those of ``on``, host:port, if given)."""
    names: list[str] = store.split(subrun_names(store, count, on))
    return names
