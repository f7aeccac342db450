"""The delivery side's sweeper rules (group ``delivery``): stuck, orphaned, expired queues."""

from __future__ import annotations

#: The group these rules belong to (``inturn sweep --only delivery``).
GROUP = "delivery"
