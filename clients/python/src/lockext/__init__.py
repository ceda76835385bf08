"""lockext client for Python (psycopg 3): leases renewed in the background, fenced writes.

    with lockext.lock("postgresql://...", "job:7", ttl=30) as grant:
        with grant.transaction(conn, fence="job:7:output"):
            conn.execute("UPDATE ...")

See README.md beside this package for what it does and its limits.
"""

from ._async import AsyncGrant, adeclare_token, afence, afenced_update, alock
from ._common import (
    Error, Holder, InvalidArgument, LeaseLost, NotAcquired, NotSupported, Observed,
    PermissionDenied, ReadOnlyServer, StaleToken, default_owner,
)
from ._sync import (
    Grant, KeepAlive, campaign, declare_token, fence, fenced_update, holders, keepalive, lock, observe,
)

__version__ = "0.1.0"

__all__ = [
    "lock", "Grant", "fenced_update", "fence", "declare_token",
    "campaign", "holders", "observe", "Holder", "Observed", "keepalive", "KeepAlive",
    "alock", "AsyncGrant", "afenced_update", "afence", "adeclare_token",
    "Error", "NotAcquired", "LeaseLost", "StaleToken", "InvalidArgument",
    "ReadOnlyServer", "PermissionDenied", "NotSupported", "default_owner",
]
