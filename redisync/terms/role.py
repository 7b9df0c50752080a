"""A synced term's place in the fleet, resolved once from its mode.

Every term (the samplers, the normalisers, the curricula) names its modes in its own words
(``broadcast``, ``learner``, ...); each mode maps here, once, to one of six roles, and a term's
code asks its role what to do (declare which key, report, receive, add or take the fleet's part)
rather than comparing mode strings.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal


class Role(Enum):
    """What one shard's term does with the store."""

    ALONE = "alone"
    """``local``: nothing synced; the term is the unsynced algorithm."""
    POOLS = "pools"
    """``pooled``: its own state is a slot of a ``merge`` key; it reads the others' sum and adds its own of now."""
    WEIGHS = "weighs"
    """``weighted``: a ``merge`` slot counted by the events behind it; the fleet's weighted mean is blended in."""
    LEADS = "leads"
    """The owner of a ``broadcast`` (the learner's writer): its value is everybody's."""
    FOLLOWS = "follows"
    """Any other shard of a ``broadcast`` (a learner's reader): it takes the leader's value."""
    OBSERVES = "observes"
    """``observe``: reports its own state as ``pooled`` does and reads the fleet's, but acts on its own
    alone (the unsynced algorithm): an unsynced run that measures how far it drifts from pooled."""

    @property
    def syncs(self) -> bool:
        """Whether the term declares a key at all."""
        return self is not Role.ALONE

    @property
    def reports(self) -> bool:
        """Whether this shard's reports carry anything (a follower's carry nothing)."""
        return self in (Role.POOLS, Role.WEIGHS, Role.LEADS, Role.OBSERVES)

    @property
    def reads_fleet(self) -> bool:
        """Whether this shard keeps the fleet's state (to use it, or, observing, to measure against it)."""
        return self.receives or self is Role.OBSERVES

    @property
    def pools(self) -> bool:
        """Whether its own state is a slot of a ``merge`` key summed with the others' (pooled or observed):
        the fleet part it keeps is the others' sum."""
        return self in (Role.POOLS, Role.OBSERVES)

    @property
    def receives(self) -> bool:
        """Whether the fleet state changes what this shard holds (a leader's own value is the fleet's)."""
        return self in (Role.POOLS, Role.WEIGHS, Role.FOLLOWS)

    @property
    def broadcasts(self) -> bool:
        """Whether its key is one value for the fleet (a ``broadcast``'s leader or follower), not a slot each."""
        return self in (Role.LEADS, Role.FOLLOWS)

    @property
    def acts_alone(self) -> bool:
        """Whether the term acts on its own state only (the unsynced algorithm, synced or not)."""
        return self in (Role.ALONE, Role.OBSERVES)

    @property
    def semantics(self) -> Literal["merge", "broadcast"] | None:
        """The semantics of the key it declares (None: it declares none)."""
        if self in (Role.POOLS, Role.WEIGHS, Role.OBSERVES):
            return "merge"
        if self in (Role.LEADS, Role.FOLLOWS):
            return "broadcast"
        return None


_BY_MODE: dict[str, tuple[Role, Role]] = {  # a mode's role when this shard leads, and when it does not
    "local": (Role.ALONE, Role.ALONE),
    "pooled": (Role.POOLS, Role.POOLS),
    "weighted": (Role.WEIGHS, Role.WEIGHS),
    "broadcast": (Role.LEADS, Role.FOLLOWS),
    "learner": (Role.LEADS, Role.FOLLOWS),
    "observe": (Role.OBSERVES, Role.OBSERVES),
}
MODES: tuple[str, ...] = tuple(_BY_MODE)
"""Every mode any term offers (each term offers a subset, declared by its own ``Literal``)."""


def role_of(mode: str, *, leads: bool) -> Role:
    """The role of a term in ``mode``; ``leads``: whether this shard is the one a broadcast follows
    (its owner shard, or the learner's writer). The caller has checked ``mode`` against its own modes."""
    leading, following = _BY_MODE[mode]
    return leading if leads else following
