"""The report of a run, in markdown: the performance targets met or missed, one table per
workload (each row against the workload's references at the same client count), scale and
reaper, what each system runs, the older targets (against the floor and the article, scale
p99), where a cycle's time goes, the set-up; and the number formats the charts share.

Everything is computed from the run's result rows (runner.py), so that `--render` of a
run's JSON writes the same report again.
"""
import math

from .cluster import PG_SETTINGS
from .config import ETCD_PORT, PG_PORT, REDIS_PORT
from .systems import SYSTEM_NOTES, SYSTEMS
from .workloads import (COUNTED, REFERENCE_HEADS, SAME_COMMIT, TARGETS, UNITS, find, floor_of,
                        target_reference)

def fmt_num(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x >= 1000:
        return f"{x:,.0f}".replace(",", " ")
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def num(n):
    """1000000 as 1 000 000."""
    return f"{n:,}".replace(",", " ")


def fmt_ms(x):
    if x is None or math.isnan(x):
        return "—"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def ratio(a, b):
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return "—"
    return f"{a / b:.2f}×"


def report(cfg, results, meta, chart_names):
    L = []
    L.append(f"# lockext benchmarks, {meta['date']}")
    L.append("")
    L.append(f"`{meta['command']}` on {meta['host']}: {meta['cpus']} cores, shared with other work, "
             f"so absolute numbers drift between runs; ratios within this run are the result. "
             f"Each system ran **{meta['duration']}** per point: at each client count, all systems of "
             f"a workload one after the other, in rounds (the order reversed every other round), "
             f"so that drift in the machine hits them alike. PostgreSQL {meta['pg_version']} under pgbench -M prepared "
             f"(-j 2 from 2 clients); Redis {meta['redis_version']} under bench/redisbench.c "
             f"and etcd {meta.get('etcd_version', '?')} under bench/etcdbench "
             f"(same shape). lockext.so: {meta['library']}.")
    L.append("")
    L += target_summary(cfg, results)
    for name in chart_names:
        L.append(f"![{name}]({name})")
        L.append("")
    L.append("Latencies are of one whole transaction of the workload (a cycle is acquire + release), "
             "in ms. **× article** and **× floor** divide this row's value by the article's design "
             "and by the floor (or by the references that the section's title names) at the same "
             "client count: above 1 is better for throughput, below 1 "
             "is better for latency. fsyncs, WAL bytes: per operation, from pg_stat_wal (all "
             "processes, so WAL writer flushes of asynchronous commits count too); WAL recs: WAL records per "
             "operation.")
    L.append("")
    titles = {
        "cycle": "1. Cycle: acquire a random free lock among {keys} ids, release it",
        "contended": "2. Contended: every client on one lock (throughput = successful hand-offs; "
                     "latency = one attempt; Jain's index of hand-offs per client, 1 = even)",
        "heartbeat": "3. Heartbeat: renew random ones of {hb} live leases "
                     "(× floor = against the bare UPDATE committed the same way)",
        "fenced": "4. Fenced writes: a valid token on random ones of {hb} resources "
                  "(the article's fenced UPDATE, with >=, is the floor here)",
        "shared": "7. Shared locks: every client takes `mode => 'shared'` on one id, releases it "
                  "(× exclusive = lockext's exclusive cycle on {keys} random ids; × floor = the "
                  "floor of a read lock)",
        "semaphore": "8. Semaphore: every client on one semaphore, waiting for a permit "
                     "(throughput = grants; latency = one attempt, from joining the queue to the "
                     "permit, and the release; × random ids = exclusive locks on {keys} random "
                     "ids, where no one waits; × one lock = the same clients waiting for one "
                     "exclusive lock; Jain's index of grants per client, 1 = even)",
    }
    fmt = {"keys": num(cfg.keys), "hb": num(cfg.hb_keys)}
    for name in ("cycle", "contended", "heartbeat", "fenced"):
        L += workload_table(name, titles[name].format(**fmt), results)

    rows = [r for r in results if r["workload"] == "scale"]
    if rows:
        sizes = sorted({r["leases"] for r in rows})
        L.append(f"## 5. Scale: the lockext cycle with {', '.join(f'{s:,}'.replace(',', ' ') for s in sizes)} "
                 "live leases in the table")
        L.append("")
        L.append("| clients | mode | " + " | ".join(f"{num(s)} leases: cycles/s, p50, p99" for s in sizes) +
                 f" | p99 {num(sizes[-1])} / p99 {num(sizes[0])} |")
        L.append("|---:|---|" + "---:|" * (len(sizes) + 1))
        for clients in cfg.clients:
            for system in ("lockext", "lockext_epoch"):
                cells = []
                pts = [find(results, "scale", system, clients, leases=s) for s in sizes]
                if not all(pts):
                    continue
                for p in pts:
                    cells.append(f"{fmt_num(p['tps'])}, {fmt_ms(p['p50'])}, {fmt_ms(p['p99'])}")
                cells.append(ratio(pts[-1]["p99"], pts[0]["p99"]))
                L.append(f"| {clients} | {SYSTEMS[system][0]} | " + " | ".join(cells) + " |")
        L.append("")

    rows = [r for r in results if r["workload"] == "reaper"]
    if rows:
        L.append(f"## 6. Reaper: {rows[0]['leases']:,} leases expire at once".replace(",", " "))
        L.append("")
        L.append("While lockext cycles run (pgbench in chunks of "
                 f"{cfg.reaper_chunk} s), the leases expire together; the reaper deletes them in "
                 "batches. *Before*: cycles that ended before the expiry (1M live leases in the table); "
                 "*during*: between the expiry and the reaper's last deletion; *after*: the rest.")
        L.append("")
        L.append("| clients | time to clear | leases/s | cycle p50 / p99 before | during | after | p99 during / before |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            L.append(f"| {r['clients']} | {r['clear_s']:.1f} s | {fmt_num(r['rate'])} | "
                     f"{fmt_ms(r['p50_before'])} / {fmt_ms(r['p99_before'])} | "
                     f"{fmt_ms(r['p50_during'])} / {fmt_ms(r['p99_during'])} | "
                     f"{fmt_ms(r['p50_after'])} / {fmt_ms(r['p99_after'])} | "
                     f"{ratio(r['p99_during'], r['p99_before'])} |")
        L.append("")

    for name in ("shared", "semaphore"):
        L += workload_table(name, titles[name].format(**fmt), results)

    L.append("## The systems")
    L.append("")
    for key, text in SYSTEM_NOTES:
        if any(r.get("system") == key for r in results):
            L.append(f"- **{SYSTEMS[key][0]}**: {text}")
    L.append("")
    L += targets(cfg, results)
    L += breakdown(results)
    L.append("## Set-up")
    L.append("")
    L.append("- Scratch cluster on port %d: configured as `scripts/cluster.sh` configures its own "
             "(loopback, lockext preloaded, reaper every 1 s), but run from a copy of the installed "
             "PostgreSQL and lockext taken at the start (so that a `make install` during the run "
             "cannot crash it), with: %s. Everything else is PostgreSQL's default (fsync on, "
             "wal_sync_method fdatasync, synchronous_commit on, full_page_writes on, autovacuum on). "
             "CHECKPOINT before each workload, VACUUM before each client count." % (
                 PG_PORT, ", ".join(f"{k} = {v}" for k, v in PG_SETTINGS.items())))
    L.append(f"- Redis: `redis-server` on 127.0.0.1:{REDIS_PORT}, appendonly yes, save \"\", "
             "auto-aof-rewrite off; `CONFIG SET appendfsync always|everysec` before each run.")
    L.append(f"- etcd: one member on 127.0.0.1:{ETCD_PORT}, a fresh data directory, every other "
             "setting etcd's default (its WAL synced before a write is answered); "
             "`bench/etcdbench` (Rust, the `etcd-client` crate: etcd's gRPC API), a connection "
             "per client on a runtime of min(clients, 2) threads.")
    L.append("- Scripts: `bench/pgbench/*.sql` (one per system and workload), `bench/setup.sql` "
             "(the other systems' schemas), `bench/redisbench.c`, `bench/etcdbench/`. Fills of 10k-1M leases are written "
             "straight into `lockext.locks` by the superuser; the heartbeat's leases are real grants.")
    L.append("")
    return "\n".join(L) + "\n"


def target_summary(cfg, results):
    """The project's performance targets (workloads.TARGETS), each at every client count
    of the run, from the run's own rows."""
    L = ["## Performance targets", ""]
    L.append("Each target is a ratio within this run, at the same client count: the lockext "
             "system's throughput over its reference's (p99: its 99th percentile latency over "
             "the reference's; WAL: the lockext system's WAL records per cycle minus its "
             "reference's). Beside each throughput, *p99* gives the same pair's p99 ratio (below "
             "1 is better). *not run*: the run left the workload (or the system) out; *no "
             "pair*: no workload measures it.")
    L.append("")
    heads = [f"{c} client{'s' if c > 1 else ''}" for c in cfg.clients]
    L.append("| target | system | against | goal | " + " | ".join(heads) + " |")
    L.append("|---|---|---|---:|" + "---:|" * len(heads))
    for t in TARGETS:
        if t.metric == "tps":
            goal = f"≥ {t.goal:g}×"
        elif t.metric == "p99":
            goal = f"≤ {t.goal:g}×"
        else:
            goal = f"≤ +{t.goal:g}"
        if t.system is None:
            L.append(f"| {t.name} | none: {t.missing} | — | {goal} | " +
                     " | ".join(["no pair"] * len(heads)) + " |")
            continue
        cells, refs = [], []
        for clients in cfg.clients:
            row = find(results, t.workload, t.system, clients)
            ref = row and find(results, t.workload, target_reference(t, row, results), clients)
            if not row or not ref:
                cells.append("not run")
                continue
            refs.append(ref["system"])
            if t.metric == "tps":
                value = row["tps"] / ref["tps"]
                ok = value >= t.goal
                text = f"{precise(value, t.goal, ok)}×"
            elif t.metric == "p99":
                value = row["p99"] / ref["p99"]
                ok = value <= t.goal
                text = f"{precise(value, t.goal, ok)}×"
            else:
                if row.get(t.metric) is None or ref.get(t.metric) is None:
                    cells.append("—")
                    continue
                value = row[t.metric] - ref[t.metric]
                ok = value <= t.goal
                text = precise(value, t.goal, ok, "+")
            cell = f"{text} met" if ok else f"{text} **missed**"
            if t.metric == "tps":
                cell += f" · p99 {ratio(row['p99'], ref['p99'])}"
            cells.append(cell)
        if t.reference == SAME_COMMIT:
            against = "bare UPDATE committed the same way"
            if refs:
                against += " (" + "; ".join(dict.fromkeys(SYSTEMS[s][0] for s in refs)) + ")"
        else:
            against = SYSTEMS[t.reference][0]
        L.append(f"| {t.name} | {SYSTEMS[t.system][0]} | {against} | {goal} | " +
                 " | ".join(cells) + " |")
    L.append("")
    return L


def precise(value, goal, ok, sign=""):
    """value with 2 decimals, or 3 where 2 would show a missed target as its goal."""
    text = f"{value:{sign}.2f}"
    if not ok and text == f"{goal:{sign}.2f}":
        text = f"{value:{sign}.3f}"
    return text


def workload_table(name, title, results):
    """One workload's section: each row against the workload's references, at the same
    client count."""
    rows = [r for r in results if r["workload"] == name]
    if not rows:
        return []
    heads = REFERENCE_HEADS.get(name, ("× article", "× floor"))
    head = ["clients", "system"]
    for metric in (UNITS[name], "p50 ms", "p99 ms"):
        head += [metric, *heads]
    if name in COUNTED:
        head += ["attempts/s", "Jain"]
    head += ["fsyncs", "WAL recs", "WAL B"]
    L = ["## " + title, ""]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "|".join("---:" if i not in (1,) else "---" for i in range(len(head))) + "|")
    for r in rows:
        refs = [find(results, name, ref, r["clients"]) for ref in floor_of(name, r, results)]
        cells = [str(r["clients"]), f"**{r['label']}**" if r["system"].startswith("lockext") else r["label"]]
        for key, fmt in (("tps", fmt_num), ("p50", fmt_ms), ("p99", fmt_ms)):
            cells += [fmt(r[key])] + [ratio(r[key], ref and ref[key]) for ref in refs]
        if name in COUNTED:
            cells += [fmt_num(r.get("attempts")), f"{r['jain']:.3f}" if "jain" in r else "—"]
        cells += [fmt_num(r.get("fsyncs")), fmt_num(r.get("wal_records")), fmt_num(r.get("wal_bytes"))]
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    return L


def targets(cfg, results):
    L = ["## Earlier targets: against the article, and latency at scale", ""]
    L.append("| target | clients | measured | met |")
    L.append("|---|---:|---:|:---:|")

    measured = []

    def line(what, clients, value, goal, higher=True):
        if value is None:
            L.append(f"| {what} | {clients} | — | — |")
            return
        measured.append(what)
        ok = value >= goal if higher else value <= goal
        L.append(f"| {what} | {clients} | {value:.2f}× | {'yes' if ok else '**no**'} |")

    for clients in (1, 16):
        if clients not in cfg.clients:
            continue
        f = find(results, "cycle", "floor", clients)
        a = find(results, "cycle", "article", clients)
        names = []
        for system, name in (("lockext", "lockext"), ("lockext_async", "lockext, client-side async release")):
            r = find(results, "cycle", system, clients)
            if r and r.get("fsyncs") is not None:
                name += f" ({r['fsyncs']:.2f} fsyncs/cycle)"
            names.append((system, name))
        for system, name in names:
            r = find(results, "cycle", system, clients)
            line(f"{name} cycle ≥ 0.9× floor", clients, r and f and r["tps"] / f["tps"], 0.9)
        for system, name in names:
            r = find(results, "cycle", system, clients)
            goal = 2.0 if clients == 1 else 1.6
            line(f"{name} cycle ≥ {goal}× article", clients, r and a and r["tps"] / a["tps"], goal)
        r = find(results, "cycle", "lockext_epoch", clients)
        line("lockext epoch mode cycle ≥ 2× floor", clients, r and f and r["tps"] / f["tps"], 2.0)
    for clients in cfg.clients:
        for system in ("lockext", "lockext_epoch"):
            pts = sorted((r for r in results if r["workload"] == "scale" and r["system"] == system
                          and r["clients"] == clients), key=lambda r: r["leases"])
            if len(pts) >= 2:
                line(f"{SYSTEMS[system][0]}: p99 at {num(pts[-1]['leases'])} leases ≤ 1.5× p99 at "
                     f"{num(pts[0]['leases'])}", clients,
                     pts[-1]["p99"] / pts[0]["p99"], 1.5, higher=False)
    for clients in cfg.clients:
        for system in ("lockext", "lockext_async"):
            r = find(results, "heartbeat", system, clients)
            if not r:
                continue
            ref = floor_of("heartbeat", r, results)[1]
            b = find(results, "heartbeat", ref, clients)
            line(f"{SYSTEMS[system][0]} renewals ≥ 0.9× {SYSTEMS[ref][0]} (committed the same way)",
                 clients, r and b and r["tps"] / b["tps"], 0.9)
    L.append("")
    return L if measured else []  # a run without the cycle, scale or heartbeat workloads


def breakdown(results):
    """Where a lockext cycle's time goes: per statement (pgbench -r), fsyncs and WAL."""
    L = ["## Where the time goes (cycle, per statement, pgbench -r)", ""]
    L.append("| clients | system | statement latencies, ms | fsyncs/cycle | WAL records | WAL bytes | µs per WAL fsync |")
    L.append("|---:|---|---|---:|---:|---:|---:|")
    rows = [r for r in results if r["workload"] == "cycle" and "statements" in r]
    if not rows:
        return []
    for r in rows:
        stmts = "; ".join(f"{short(s)} {ms:.3f}" for ms, s in r["statements"])
        L.append(f"| {r['clients']} | {r['label']} | {stmts} | {fmt_num(r['fsyncs'])} | "
                 f"{fmt_num(r['wal_records'])} | {fmt_num(r['wal_bytes'])} | {fmt_num(r['fsync_us'])} |")
    L.append("")
    return L


def short(stmt):
    s = stmt.upper()
    for key, name in (("LOCK_ACQUIRE", "acquire"), ("LOCK_RELEASE", "release"),
                      ("PG_TRY_ADVISORY", "try_lock"), ("PG_ADVISORY_UNLOCK", "unlock"),
                      ("INSERT", "INSERT"), ("DELETE FROM DISTRIBUTED_LOCKS WHERE LOCK_ID = 'LOCK:' || :ID AND EXPIRES", "DELETE expired"),
                      ("DELETE", "DELETE"), ("BEGIN", "BEGIN"), ("COMMIT", "COMMIT")):
        if key in s:
            return name
    return stmt[:20]
