"""Load through the coordinator: T threads calling proto.acquire_<variant>(lock, owner) on 40 lock
ids for D seconds; every returned token recorded with its send/receive times. Then: for each lock id,
a call sent after another returned must get a higher token (real-time order), and every token a
client received must be in proto.grants (no lost grant)."""
import sys, time, threading, random, psycopg2, collections
variant, T, D = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
dsn = "host=127.0.0.1 port=6500 user=postgres dbname=postgres"
recs, errs = [], collections.Counter()
lock = threading.Lock()
def worker(i):
    c = psycopg2.connect(dsn); c.autocommit = True; cur = c.cursor()
    end = time.time() + D; mine = []
    rnd = random.Random(i)
    while time.time() < end:
        k = "k%d" % rnd.randint(1, 40)
        t0 = time.monotonic()
        try:
            cur.execute("SELECT proto.acquire_%s('%s', 'o%d')" % (variant, k, i))
            tok = cur.fetchone()[0]
        except Exception as e:
            with lock: errs[str(e).splitlines()[0][:90]] += 1
            continue
        mine.append((k, tok, t0, time.monotonic(), time.time(), c.notices[-1].strip() if c.notices else ''))
        del c.notices[:]
    with lock: recs.extend(mine)
ths = [threading.Thread(target=worker, args=(i,)) for i in range(T)]
[t.start() for t in ths]; [t.join() for t in ths]
by = collections.defaultdict(list)
for r in recs: by[r[0]].append(r)
viol, worst = 0, 0
for k, rs in by.items():
    rs.sort(key=lambda r: r[2])           # by send time
    done = sorted(rs, key=lambda r: r[3])  # by receive time
    j, maxdone = 0, 0
    for r in rs:
        while j < len(done) and done[j][3] < r[2]:
            maxdone = max(maxdone, done[j][1]); j += 1
        if r[1] <= maxdone:
            viol += 1; worst = max(worst, maxdone - r[1])
c = psycopg2.connect(dsn); cur = c.cursor()
cur.execute("SELECT lock_id, token FROM proto.grants WHERE variant = %s", (variant,))
db = set(cur.fetchall())
lost = [r for r in recs if (r[0], r[1]) not in db]
print("variant %s: calls %d (%.0f/s), errors %d %s" % (variant, len(recs), len(recs) / D, sum(errs.values()), dict(errs)))
print("  real-time order violations per lock id: %d (largest drop %d)" % (viol, worst))
print("  tokens a client received that proto.grants lacks: %d" % len(lost))
for r in sorted(lost, key=lambda r: r[4])[:400]: print("  LOST %s %d wall=%.3f %s" % (r[0], r[1], r[4], r[5]))
dup = collections.Counter((r[0], r[1]) for r in recs); print("  same token twice for one lock id: %d" % sum(1 for v in dup.values() if v > 1))
# Order between different lock ids: the same check, grouped by shard, and over all ids at once.
cur.execute("SELECT k, get_shard_id_for_distribution_column('proto.leases', k) FROM unnest(%s::text[]) k", (list(by.keys()),))
shard = dict(cur.fetchall())
def violations(groups):
    v = 0
    for rs in groups.values():
        rs = sorted(rs, key=lambda r: r[2]); done = sorted(rs, key=lambda r: r[3]); j = 0; mx = 0
        for r in rs:
            while j < len(done) and done[j][3] < r[2]:
                mx = max(mx, done[j][1]); j += 1
            if r[1] <= mx: v += 1
    return v
byshard = collections.defaultdict(list)
for r in recs: byshard[shard[r[0]]].append(r)
print("  real-time order violations between lock ids of one shard: %d; over all ids (across shards): %d" % (violations(byshard), violations({0: recs})))
