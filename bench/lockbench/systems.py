"""The systems a run compares: lockext in its modes (default durability, client-side
asynchronous release, epoch mode, waiting in its queue, shared, semaphores), the article's
design, the floors (what the cheapest table would cost for the same work), advisory
locks, bare UPDATEs, Redis and etcd. Each has a label, a colour for the charts, how it commits,
and the paragraph of the report that says what it runs.

A system is a name here; which pgbench script it runs in which workload is workloads.py's.
"""

# PGOPTIONS of the systems that run a script under other settings.
ARTICLE = "-c search_path=article"
EPOCH = "-c lockext.durability=epoch -c synchronous_commit=off"

# System: label, colour, how it commits (the heartbeat floor is the bare UPDATE committed
# the same way).
SYSTEMS = {
    "lockext": ("lockext", "#1f6feb", "sync"),
    "lockext_async": ("lockext, client sets async release/renew", "#58a6ff", "async"),
    "lockext_epoch": ("lockext, epoch mode", "#0a3069", "async"),
    "lockext_wait": ("lockext, waiting in its FIFO queue", "#2da44e", "sync"),
    "article": ("article's design", "#cf222e", "sync"),
    "advisory": ("advisory locks", "#8250df", "none"),
    "floor": ("floor (durable insert, async delete)", "#57606a", "sync"),
    "floor_async": ("insert + delete both async", "#afb8c1", "async"),
    "floor_fn": ("floor as functions", "#8c959f", "sync"),
    "floor_fn_async": ("floor as functions, both async", "#d0d7de", "async"),
    "bare": ("bare UPDATE", "#57606a", "sync"),
    "bare_async": ("bare UPDATE, async", "#afb8c1", "async"),
    "bare_indexed": ("bare UPDATE, expires_at indexed", "#6e7781", "sync"),
    "bare_indexed_async": ("bare UPDATE, expires_at indexed, async", "#d0d7de", "async"),
    "redis_always": ("Redis, appendfsync always", "#bf8700", "sync"),
    "redis_everysec": ("Redis, appendfsync everysec", "#f2cc60", "async"),
    "lockext_guarded": ("lockext fence_guard, token in SET", "#1b7c83", "sync"),
    "lockext_guarded_declared": ("lockext fence_guard, token declared", "#54aeff", "sync"),
    "unguarded": ("the same UPDATE, unguarded", "#57606a", "sync"),
    "unguarded_tx": ("the declared way's transaction, unguarded", "#8c959f", "sync"),
    "etcd": ("etcd, lock recipe (a lease per grant)", "#6639ba", "sync"),
    "etcd_session": ("etcd, lock recipe on a session lease", "#a475f9", "sync"),
    "lockext_shared": ("lockext, shared, one id", "#1f6feb", "sync"),
    "lockext_shared_epoch": ("lockext, shared, one id, epoch mode", "#0a3069", "async"),
    "lockext_exclusive": ("lockext, exclusive, random ids", "#1b7c83", "sync"),
    "advisory_shared": ("advisory locks, shared, one key", "#8250df", "none"),
    "floor_shared": ("floor of a read lock", "#57606a", "sync"),
    "floor_shared_async": ("floor of a read lock, both async", "#afb8c1", "async"),
    "lockext_sem4": ("lockext, 4 permits, waiting", "#1f6feb", "sync"),
    "lockext_sem16": ("lockext, 16 permits, waiting", "#58a6ff", "sync"),
}
# pgbench variables (-D) of the systems that share one script.
SYSTEM_VARIABLES = {"lockext_sem4": {"permits": 4}, "lockext_sem16": {"permits": 16}}

SYSTEM_NOTES = [
    ("lockext", "`lockext.lock_acquire` then `lockext.lock_release` with the token, one round trip "
                "each, default settings (`lockext.durability = grant`, `synchronous_commit = on`): "
                "the grant commits durably; whether the release (and a renewal) waits for its flush "
                "is lockext's choice, and the fsyncs column shows it."),
    ("lockext_async", "the same, but the client makes the release (heartbeat: the renewal) commit "
                      "asynchronously: one statement `SELECT set_config('synchronous_commit', 'off', "
                      "true), lockext.lock_release(...)`; the grant stays durable. Where lockext "
                      "already commits releases asynchronously, this equals the row above."),
    ("lockext_epoch", "`lockext.durability = epoch` and `synchronous_commit = off` for the session: "
                      "grants, releases and fenced writes all commit asynchronously; tokens stay safe "
                      "through boot epochs."),
    ("lockext_wait", "contended and semaphore workloads: each attempt calls `lock_acquire(..., wait "
                     "=> '10 seconds')` on the one exclusive lock and waits in lockext's FIFO queue "
                     "(woken by the release) instead of retrying; its latency is the hand-off "
                     "latency, from joining the queue to holding the lock."),
    ("article", "the article's code as SQL, statement for statement, in schema `article` with its "
                "own table, index and sequence: acquire = `BEGIN; DELETE expired; INSERT ... ON "
                "CONFLICT DO NOTHING RETURNING; COMMIT` (four round trips), release = `DELETE` by "
                "owner, renew = its `UPDATE`, fenced write = its `UPDATE ... WHERE token` (with `>=`)."),
    ("advisory", "`pg_try_advisory_lock(id)` / `pg_advisory_unlock(id)`: in memory, no lease, no "
                 "token, nothing durable: the ceiling."),
    ("floor", "one single-row `INSERT` into a two-column table (text primary key), committed "
              "durably, and a `DELETE` committed with `set_config('synchronous_commit', 'off', true)`: "
              "one fsync per cycle, what any durable grant pays."),
    ("floor_async", "the same `INSERT` and `DELETE`, both committed asynchronously: what a grant "
                    "costs when nothing waits for the disk (the yardstick of epoch mode)."),
    ("floor_fn", "the floor's `INSERT` and `DELETE`, each the body of a PL/pgSQL function called as "
                 "lockext's are (`SECURITY DEFINER`, `SET search_path`), nothing else in it: what "
                 "the call itself adds (bench/setup.sql)."),
    ("floor_fn_async", "the same two functions, the `INSERT` committed asynchronously too."),
    ("bare", "`UPDATE` of one row by primary key, `expires_at` not indexed (HOT), durable."),
    ("bare_async", "the same `UPDATE` committed asynchronously."),
    ("bare_indexed", "the same `UPDATE` on a table whose `expires_at` is indexed, as in "
                     "`lockext.locks` (no HOT update: every renewal inserts into both indexes)."),
    ("bare_indexed_async", "the indexed `UPDATE`, committed asynchronously."),
    ("redis_always", "`SET key value NX PX ttl`, release by the article's Lua compare-and-delete "
                     "(`EVAL`); renew = Lua compare-and-`PEXPIRE`; fenced write = Lua "
                     "compare-and-set on a hash; AOF with `appendfsync always` (durable)."),
    ("redis_everysec", "the same with `appendfsync everysec` (up to a second of writes lost in a crash)."),
    ("lockext_guarded", "fenced workload: `UPDATE guarded.rows SET n = n + 1, fence_token = :tok "
                        "WHERE id = :id` on a table of as many rows as the workload's resources, guarded by `lockext.fence_guard("
                        "'fence_token')` (the token in the SET list), durable."),
    ("lockext_guarded_declared", "the same table: `BEGIN; SELECT lockext.declare_token(:tok); "
                                 "UPDATE guarded.rows SET n = n + 1 WHERE id = :id; COMMIT` (the "
                                 "token column left out, the token declared)."),
    ("unguarded", "the guarded rows' reference: the same `UPDATE ... SET n = n + 1, fence_token = "
                  ":tok` of the same table without the trigger."),
    ("unguarded_tx", "the declared way's reference: `BEGIN; SELECT :tok::bigint; UPDATE guarded.plain "
                     "SET n = n + 1 WHERE id = :id; COMMIT`, the same four statements without "
                     "lockext (the declared way needs its transaction; its cost over this is lockext's)."),
    ("etcd", "one etcd member at its defaults (its WAL synced before a write is answered), driven "
             "by `bench/etcdbench` over etcd's gRPC API, a connection per client: etcd's lock "
             "recipe with a lease per grant, as a lockext acquire has a TTL per grant: "
             "`LeaseGrant(30 s)`, a transaction that puts the key with that lease if its "
             "`create_revision` is 0 (the key's create revision is the fencing token), then the "
             "release: a transaction that deletes the key if it still carries the lease, and "
             "`LeaseRevoke`. Four writes through etcd's Raft log per cycle, each durable."),
    ("etcd_session", "the same recipe on one lease per client, granted at its start, the way "
                     "etcd's `concurrency.Session` does: the cycle is the put-if-absent and the "
                     "delete, two durable writes (a lease no longer says how long one grant lives)."),
    ("lockext_shared", "`lockext.lock_acquire('shared-hot', ..., mode => 'shared')` then "
                       "`lockext.lock_release` with the token, every client on the one id (each "
                       "reader a lease and a token of its own), default settings. No one takes the "
                       "id exclusively: a refused grant stops the run."),
    ("lockext_shared_epoch", "the same in epoch mode (`lockext.durability = epoch`, "
                             "`synchronous_commit = off`)."),
    ("lockext_exclusive", "the cycle's `lockext` (`bench/pgbench/cycle_lockext.sql`): an exclusive "
                          "acquire and release of a random one of 100 000 ids, so that no one "
                          "contends or waits (in the semaphore workload with the grant counter "
                          "pipelined with the release)."),
    ("advisory_shared", "`pg_try_advisory_lock_shared(1)` / `pg_advisory_unlock_shared(1)`: "
                        "PostgreSQL's own read lock, in memory, no lease, no token: the ceiling."),
    ("floor_shared", "a single-row `INSERT` of (id, owner) into a table keyed by both, as "
                     "`lockext.shared_leases` is, committed durably, and its `DELETE` committed "
                     "asynchronously: what any durable read grant pays (it does not even look for "
                     "a writer)."),
    ("floor_shared_async", "the same `INSERT` and `DELETE`, both committed asynchronously (the "
                           "yardstick of epoch mode)."),
    ("lockext_sem4", "`lockext.lock_acquire('sem:4', ..., wait => '5 seconds', permits => 4)`, then "
                     "the release with the token and the client's grant counter in one pipeline: "
                     "each attempt waits in lockext's queue for one of 4 permits."),
    ("lockext_sem16", "the same on a semaphore of 16 permits (`sem:16`): with 16 clients or fewer, "
                      "a permit is always free, so that none should wait."),
]


def script_variables(system, keys):
    """The pgbench variables of one system's script (besides Runner.vars)."""
    return dict({"keys": keys}, **SYSTEM_VARIABLES.get(system, {}))
