"""Shares of a concurrency limit: the slots of one limited dependency split among the
processes that admit jobs to it, so that admission is local to a process except when its
share changes.  Pure: no I/O, no clock reads.

Each owner (a worker process) holds a *share* of a limited dependency: a number of slots,
until a time.  It admits its jobs against its own share -- in the store, reading and
writing only its own rows; between exchanges, in its own memory -- and only to grow a share
does it lock the dependency's row and look at everyone else's.

Why the limit holds: an owner admits only while its holds are below its share; a share
grows only under the dependency's lock, to at most the limit less what every other owner
*reserves* -- its share while that is live, and never less than the holds it still has.
Nobody waits on anyone else's share row: an owner admits under its share only while the
share has ``LOCAL_MARGIN`` left, and counts for the others until it expires, so an
admission under way elsewhere is always covered by a share the grower counts (unless
clocks differ by more than the margin).

Why shares move with demand: a share grows to what its owner needs now plus headroom (as
much again, at most half of what is left free), so the next starts are local; an
owner refused for want of slots records how many it wanted, and an owner with slots to
spare gives them back when it next renews its share (down to what it holds).  A share not
renewed within ``SHARE_TTL`` lapses, and a gone owner's is dropped with its jobs' recovery.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

# How long a share lasts unless renewed; its owner renews it on its exchanges once it has
# less than SHARE_TTL - RENEW_AFTER left, so about every RENEW_AFTER seconds while busy.
SHARE_TTL = 10.0
RENEW_AFTER = 2.0
# An owner admits under its share only while the share has at least this long to run, so
# that the holds it admits (in the store, or in memory until its next exchange) are covered
# by a share everyone else still counts.
LOCAL_MARGIN = 4.0
# A share grows by at least this much headroom when the limit leaves room for it.
MIN_HEADROOM = 8


@dataclasses.dataclass(frozen=True)
class Share:
    """An owner's share of one dependency: ``slots`` until ``expires``; ``wanted``: slots it
    was refused the last time it asked (others give theirs back while it wants)."""

    slots: int
    expires: float
    wanted: int = 0

    def live(self, now: float) -> bool:
        """Whether it still counts against everyone else."""
        return self.expires > now

    def usable(self, now: float) -> bool:
        """Whether its owner may still admit under it."""
        return self.expires - LOCAL_MARGIN > now


def reserved(share: Share | None, holds: int, now: float) -> int:
    """What an owner keeps from everyone else: its live share, never less than its holds."""
    return max(share.slots if share is not None and share.live(now) else 0, holds)


def others(shares: Mapping[str, Share], holds: Mapping[str, int], owner: str, now: float) -> tuple[int, int]:
    """(slots reserved, slots wanted) by every owner but ``owner``."""
    names = (set(shares) | set(holds)) - {owner}
    taken = sum(reserved(shares.get(name), holds.get(name, 0), now) for name in names)
    wanted = sum(shares[name].wanted for name in names if name in shares and shares[name].live(now))
    return taken, wanted


def grown(limit: int, holds: int, asked: int, others_reserved: int) -> int:
    """The share an owner holding ``holds`` slots and asking for ``asked`` more gets: what it
    asks if the limit has room, plus headroom -- as much again as it then needs (at least
    ``MIN_HEADROOM``), at most half of what is left free -- and never less than it holds.
    Doubling: a worker that admits its jobs one at a time grows its share a few times, not
    once per job."""
    free = limit - others_reserved
    need = holds + asked
    headroom = min(max(need, MIN_HEADROOM), max(0, free - need) // 2)
    return max(holds, min(free, need + headroom))


def kept(share: Share, holds: int, others_wanted: int) -> int:
    """The slots an owner keeps when it renews its share: all of them, unless others want
    slots: then what it holds."""
    return min(share.slots, holds) if others_wanted > 0 else share.slots


def local_room(share: Share | None, limit: int, holding: int, now: float) -> int:
    """How many more jobs an owner may admit in its own memory under this share."""
    if share is None or not share.usable(now):
        return 0
    return max(0, min(share.slots, limit) - holding)


def renewal_due(shares: Iterable[Share], now: float) -> bool:
    return any(share.expires - now < SHARE_TTL - RENEW_AFTER for share in shares)
