"""Plain router INSERTs through the coordinator (no function, no delegation) during shard moves:
every acknowledged row must be there afterwards. argv: seconds, synchronous_commit for the workers' side."""
import sys, time, threading, psycopg2
D = float(sys.argv[1]); sc = sys.argv[2]
dsn = "host=127.0.0.1 port=6500 user=postgres dbname=postgres"
acked, lock = [], threading.Lock()
def w(i):
    c = psycopg2.connect(dsn); c.autocommit = True; cur = c.cursor(); mine = []; n = 0
    end = time.time() + D
    while time.time() < end:
        n += 1; key = "p%d-%d" % (i, n)
        cur.execute("INSERT INTO proto.grants VALUES (%s, %s, 0, now(), 'plain')", (key, n))
        mine.append(key)
    with lock: acked.extend(mine)
ts = [threading.Thread(target=w, args=(i,)) for i in range(4)]; [t.start() for t in ts]; [t.join() for t in ts]
c = psycopg2.connect(dsn); cur = c.cursor(); cur.execute("SELECT lock_id FROM proto.grants WHERE variant = 'plain'")
have = set(r[0] for r in cur.fetchall()); lost = [k for k in acked if k not in have]
print("plain INSERTs (workers' synchronous_commit=%s): acknowledged %d, missing afterwards %d %s" % (sc, len(acked), len(lost), lost[:5]))
