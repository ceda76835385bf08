"""The tables some workloads need before they run: leases written straight into
lockext.locks (the scale and reaper workloads' millions), the heartbeat's live leases
(real grants, with consecutive tokens, and the same leases in the other systems' tables
and in Redis) and the fenced writes' resources.

The setups are closures that Runner.workload calls after it logs the workload's start, so
that a fill's time shows in the log where it is spent.
"""
from .cluster import psql
from .shell import BenchError

def fill_lockext(prefix, first, last, expires_sql, db="postgres"):
    """Leases written straight into lockext.locks (as the superuser: a million calls of
    lock_acquire would take minutes). Tokens from lockext's sequence."""
    psql(db=db, sql=f"""INSERT INTO lockext.locks (lock_id, owner, fence_token, holder_role, acquired_at, expires_at)
             SELECT '{prefix}' || g, 'filler', nextval('lockext.fence_token_seq'),
                    'postgres'::regrole, clock_timestamp(), {expires_sql}
               FROM generate_series({first}, {last}) g""")


def setup_heartbeat(runner, keys):
    def setup():
        psql("TRUNCATE lockext.locks, article.distributed_locks, bare.leases, bare.leases_indexed")
        # Real grants through lockext: one statement, so the tokens are consecutive.
        psql(f"SELECT count(lockext.lock_acquire('hb:' || g, 'hb', '1 hour')) "
             f"FROM generate_series(1, {keys}) g")
        base, bad = psql("SELECT min(fence_token - substr(lock_id, 4)::bigint), "
                         "count(DISTINCT fence_token - substr(lock_id, 4)::bigint) "
                         "FROM lockext.locks WHERE lock_id LIKE 'hb:%'").split("|")
        if bad != "1":
            raise BenchError("heartbeat leases did not get consecutive tokens")
        runner.vars["base"] = int(base)
        psql(f"INSERT INTO article.distributed_locks (lock_id, owner, expires_at) "
             f"SELECT 'hb:' || g, 'hb', now() + interval '1 hour' FROM generate_series(1, {keys}) g")
        for t in ("bare.leases", "bare.leases_indexed"):
            psql(f"INSERT INTO {t} SELECT 'hb:' || g, 'hb', now() + interval '1 hour' "
                 f"FROM generate_series(1, {keys}) g")
        psql("VACUUM ANALYZE")
        runner.redis.fill([("SET", f"hb:{i}", "hb", "PX", 3600000) for i in range(1, keys + 1)])
    return setup


def setup_fenced(runner, keys):
    def setup():
        psql("TRUNCATE lockext.locks, lockext.resources, article.protected_resources")
        tok = psql("SELECT fence_token FROM lockext.lock_acquire('bench:fenced', 'bench', '1 hour')")
        runner.vars["tok"] = int(tok)
        psql(f"INSERT INTO lockext.resources SELECT 'res:' || g, {tok}, '{{\"n\": 0}}', clock_timestamp() "
             f"FROM generate_series(1, {keys}) g")
        psql(f"INSERT INTO article.protected_resources SELECT 'res:' || g, {tok}, '{{\"n\": 0}}' "
             f"FROM generate_series(1, {keys}) g")
        psql("TRUNCATE guarded.rows, guarded.plain")
        for table in ("guarded.rows", "guarded.plain"):
            psql(f"INSERT INTO {table} SELECT g, 0, {tok} FROM generate_series(1, {keys}) g")
        psql("VACUUM ANALYZE")
        runner.redis.fill([("HSET", f"res:{i}", "t", 1000, "d", '{"n": 0}') for i in range(1, keys + 1)])
    return setup
