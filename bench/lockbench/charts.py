"""The charts beside a report, as hand-written SVG (no dependencies): throughput of every
system as a multiple of its workload's reference, one panel per workload, and latency (the
cycle's p50 and p99, and lockext's p99 against the size of its table).

They divide by the same references as the report's tables (workloads.REFERENCES).
"""
import math

from .report import fmt_ms, fmt_num, num
from .systems import SYSTEMS
from .workloads import REFERENCE_HEADS, REFERENCES, UNITS, WORKLOADS, find


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def chart_throughput(cfg, results):
    """One panel per workload: each system's throughput as a multiple of the floor, on a log
    scale, grouped by client count."""
    panels = [n for n in ("cycle", "contended", "heartbeat", "fenced", "shared", "semaphore")
              if any(r["workload"] == n for r in results)]
    W, left, right = 980, 250, 120
    plot_w = W - left - right
    bar_h, gap, group_gap = 13, 3, 16
    lo, hi = 1 / 8, 64.0
    ticks = [0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64]

    def x_of(v):
        v = min(max(v, lo), hi)
        return left + plot_w * (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))

    out, y = [], 0
    titles = {"cycle": "Cycle: acquire + release, random lock (× floor)",
              "contended": "Contended: hand-offs on one lock (× floor)",
              "heartbeat": "Heartbeat: renewals (× bare UPDATE, durable)",
              "fenced": "Fenced writes (× the article's fenced UPDATE)",
              "shared": "Shared locks: acquire + release, one id (× floor of a read lock)",
              "semaphore": "Semaphore: grants, waiting (× one exclusive lock, waiting)"}
    y = 50
    for name in panels:
        rows = [r for r in results if r["workload"] == name]
        systems = [s for s, _, _ in WORKLOADS[name] if any(r["system"] == s for r in rows)]
        ref = REFERENCES[name][-1]
        ref_head = REFERENCE_HEADS.get(name, ("× floor",))[-1]
        out.append(f'<text x="{left}" y="{y}" class="title">{esc(titles[name])}</text>')
        y += 12
        top = y
        if name == "cycle":
            y += 12
        for clients in cfg.clients:
            f = find(results, name, ref, clients)
            out.append(f'<text x="{left - 8}" y="{y + 11}" class="group" text-anchor="end">'
                       f'{clients} client{"s" if clients > 1 else ""}</text>')
            y += 14
            for s in systems:
                r = find(results, name, s, clients)
                if not r or not f:
                    continue
                v = r["tps"] / f["tps"]
                label, colour, _ = SYSTEMS[s]
                x0, x1 = x_of(lo), x_of(v)
                out.append(f'<text x="{left - 8}" y="{y + bar_h - 3}" class="label" '
                           f'text-anchor="end">{esc(label)}</text>')
                out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="{bar_h}" '
                           f'fill="{colour}"><title>{esc(label)}, {clients} clients: '
                           f'{r["tps"]:.0f} {UNITS[name]}, {v:.2f}{ref_head}</title></rect>')
                out.append(f'<text x="{x1 + 4:.1f}" y="{y + bar_h - 3}" class="value">'
                           f'{v:.2f}× · {fmt_num(r["tps"])}/s</text>')
                y += bar_h + gap
            y += group_gap - gap
        bottom = y
        for t in ticks:
            x = x_of(t)
            cls = "one" if t == 1 else "grid"
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="{cls}"/>')
            out.append(f'<text x="{x:.1f}" y="{bottom + 12}" class="tick" text-anchor="middle">'
                       f'{t:g}×</text>')
        if name == "cycle":
            x = x_of(0.9)
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="target"/>')
            out.append(f'<text x="{x - 3:.1f}" y="{top + 9}" class="tick" text-anchor="end">target 0.9×</text>')
            x = x_of(2)
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="target"/>')
            out.append(f'<text x="{x + 3:.1f}" y="{top + 9}" class="tick">epoch target 2×</text>')
        y = bottom + 44
    H = y
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'viewBox="0 0 {W} {H}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">'
            '<style>.title{font-size:14px;font-weight:bold;fill:#24292f}'
            '.group{font-size:11px;font-weight:bold;fill:#24292f}.label{font-size:11px;fill:#24292f}'
            '.value{font-size:10px;fill:#424a53;paint-order:stroke;stroke:white;stroke-width:3px;stroke-linejoin:round}.tick{font-size:10px;fill:#57606a;paint-order:stroke;stroke:white;stroke-width:3px;stroke-linejoin:round}'
            '.grid{stroke:#d0d7de;stroke-width:1}.one{stroke:#24292f;stroke-width:1.5}'
            '.target{stroke:#cf222e;stroke-width:1;stroke-dasharray:4 3}</style>'
            f'<rect width="{W}" height="{H}" fill="white"/>'
            f'<text x="16" y="24" font-size="17" font-weight="bold" fill="#24292f">'
            f'lockext side by side: throughput, log scale (1× = the reference named in '
            f'each panel\'s title)</text>')
    return head + "".join(out) + "</svg>\n"


def nice_step(raw):
    """The smallest 1, 2 or 5 times a power of ten that is at least raw."""
    p = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * p >= raw:
            return round(m * p, 10)
    return 10 * p


def chart_latency(cfg, results):
    """p99 of the cycle by system and client count, and of lockext across table sizes."""
    rows = [r for r in results if r["workload"] == "cycle"]
    systems = [s for s, _, _ in WORKLOADS["cycle"] if any(r["system"] == s for r in rows)]
    W, left = 980, 250
    plot_w = W - left - 120
    vals = [r[k] for r in rows for k in ("p50", "p99") if r[k] > 0]
    if not vals:
        return None
    lo = 10 ** math.floor(math.log10(min(vals)))
    hi = 10 ** math.ceil(math.log10(max(vals)))

    def x_of(v):
        v = min(max(v, lo), hi)
        return left + plot_w * (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))

    out, y = [], 50
    out.append(f'<text x="{left}" y="{y}" class="title">Cycle latency: p50 (dark) and p99 '
               '(light), ms, log scale</text>')
    y += 12
    top = y
    for clients in cfg.clients:
        out.append(f'<text x="{left - 8}" y="{y + 11}" class="group" text-anchor="end">'
                   f'{clients} client{"s" if clients > 1 else ""}</text>')
        y += 14
        for s in systems:
            r = find(results, "cycle", s, clients)
            if not r:
                continue
            label, colour, _ = SYSTEMS[s]
            x0 = x_of(lo)
            out.append(f'<text x="{left - 8}" y="{y + 10}" class="label" text-anchor="end">{esc(label)}</text>')
            out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x_of(r["p99"]) - x0, 1):.1f}" height="13" '
                       f'fill="{colour}" opacity="0.35"/>')
            out.append(f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(x_of(r["p50"]) - x0, 1):.1f}" '
                       f'height="7" fill="{colour}"/>')
            out.append(f'<text x="{x_of(r["p99"]) + 4:.1f}" y="{y + 10}" class="value">'
                       f'{fmt_ms(r["p50"])} / {fmt_ms(r["p99"])} ms</text>')
            y += 16
        y += 12
    bottom = y
    t = lo
    while t <= hi * 1.0001:
        for m in (1, 2, 5):
            v = t * m
            if v > hi * 1.0001:
                break
            x = x_of(v)
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" class="grid"/>')
            out.append(f'<text x="{x:.1f}" y="{bottom + 12}" class="tick" text-anchor="middle">'
                       f'{round(v, 6):g}</text>')
        t *= 10
    y = bottom + 40
    # scale: p99 against table size, one line per client count and mode
    pts = [r for r in results if r["workload"] == "scale"]
    if pts:
        sizes = sorted({r["leases"] for r in pts})
        out.append(f'<text x="{left}" y="{y}" class="title">Scale: lockext cycle p99 (ms) '
                   'against live leases in the table</text>')
        y += 14
        ph = 150
        pvals = [r["p99"] for r in pts]
        step = nice_step(max(pvals) * 1.1 / 4)
        ymax = step * 4
        x_at = {s: left + 60 + i * (plot_w - 120) / max(len(sizes) - 1, 1) for i, s in enumerate(sizes)}
        for k in range(5):
            v = ymax * k / 4
            yy = y + ph - ph * k / 4
            out.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{left + plot_w}" y2="{yy:.1f}" class="grid"/>')
            out.append(f'<text x="{left - 6}" y="{yy + 3:.1f}" class="tick" text-anchor="end">{v:g}</text>')
        for s in sizes:
            out.append(f'<text x="{x_at[s]:.1f}" y="{y + ph + 14}" class="tick" text-anchor="middle">'
                       f'{num(s)} leases</text>')
        dashes = {"lockext": "", "lockext_epoch": ' stroke-dasharray="5 3"'}
        shades = ["#1f6feb", "#bf3989", "#1a7f37", "#bc4c00"]
        legend_y = y
        for ci, clients in enumerate(cfg.clients):
            for system in ("lockext", "lockext_epoch"):
                line = sorted((r for r in pts if r["clients"] == clients and r["system"] == system),
                              key=lambda r: r["leases"])
                if not line:
                    continue
                coords = " ".join(f"{x_at[r['leases']]:.1f},{y + ph - ph * r['p99'] / ymax:.1f}" for r in line)
                colour = shades[ci % len(shades)]
                out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" '
                           f'stroke-width="2"{dashes[system]}/>')
                for r in line:
                    out.append(f'<circle cx="{x_at[r["leases"]]:.1f}" cy="{y + ph - ph * r["p99"] / ymax:.1f}" '
                               f'r="3" fill="{colour}"><title>{clients} clients, {SYSTEMS[system][0]}, '
                               f'{r["leases"]} leases: p99 {r["p99"]:.3f} ms</title></circle>')
                out.append(f'<line x1="{left + plot_w + 10}" y1="{legend_y + 4}" x2="{left + plot_w + 30}" '
                           f'y2="{legend_y + 4}" stroke="{colour}" stroke-width="2"{dashes[system]}/>')
                out.append(f'<text x="{left + plot_w + 34}" y="{legend_y + 8}" class="value">{clients}c'
                           f'{" epoch" if system == "lockext_epoch" else ""}</text>')
                legend_y += 13
        y += ph + 40
    H = y
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'viewBox="0 0 {W} {H}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">'
            '<style>.title{font-size:14px;font-weight:bold;fill:#24292f}'
            '.group{font-size:11px;font-weight:bold;fill:#24292f}.label{font-size:11px;fill:#24292f}'
            '.value{font-size:10px;fill:#424a53;paint-order:stroke;stroke:white;stroke-width:3px;stroke-linejoin:round}.tick{font-size:10px;fill:#57606a;paint-order:stroke;stroke:white;stroke-width:3px;stroke-linejoin:round}'
            '.grid{stroke:#d0d7de;stroke-width:1}</style>'
            f'<rect width="{W}" height="{H}" fill="white"/>'
            f'<text x="16" y="24" font-size="17" font-weight="bold" fill="#24292f">'
            f'lockext benchmarks: latency</text>')
    return head + "".join(out) + "</svg>\n"
