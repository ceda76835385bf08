"""The charts beside a report, drawn with matplotlib as PNG files: throughput of every
system as a multiple of its workload's reference (one panel per workload, log scale, the
targets measured against that reference marked), and latency (the cycle's p50 and p99 by
system and client count, and lockext's p99 against the size of its table).

They show the rows that the report's tables hold, divided by the same references
(workloads.REFERENCES), so that a bar and a table cell never disagree.
"""
import io
import math

# A Figure of its own, not pyplot: no backend or display to choose, no global state
# between the two charts; savefig picks the PNG writer from the file name.
from matplotlib import patheffects
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from PIL import Image

from .report import fmt_ms, fmt_num, num
from .systems import SYSTEMS
from .workloads import REFERENCE_HEADS, REFERENCES, TARGETS, UNITS, WORKLOADS, find

PANELS = ("cycle", "contended", "heartbeat", "fenced", "shared", "semaphore")
THROUGHPUT_TITLES = {
    "cycle": "Cycle: acquire + release, random lock (× floor)",
    "contended": "Contended: hand-offs on one lock (× floor)",
    "heartbeat": "Heartbeat: renewals (× bare UPDATE, durable)",
    "fenced": "Fenced writes (× the article's fenced UPDATE)",
    "shared": "Shared locks: acquire + release, one id (× floor of a read lock)",
    "semaphore": "Semaphore: grants, waiting (× one exclusive lock, waiting)",
}
LO, HI = 1 / 8, 64.0  # the throughput axis: ratios beyond are drawn at the edge
TICKS = [0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64]
WIDTH = 11  # inches
ROW = 0.2  # inches per bar (or client-count heading)
PANEL = 0.85  # inches of title and axis per panel
DPI = 110
INK, MUTED, GRID, TARGET = "#24292f", "#57606a", "#d0d7de", "#cf222e"
SHADES = ["#1f6feb", "#bf3989", "#1a7f37", "#bc4c00"]
HALO = [patheffects.withStroke(linewidth=3, foreground="white")]


def clients_heading(clients):
    return f"{clients} client{'s' if clients > 1 else ''}"


def style(ax):
    ax.set_axisbelow(True)
    ax.grid(axis="x", color=GRID, linewidth=0.8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="both", labelsize=8, colors=MUTED)
    ax.tick_params(axis="y", length=0, labelcolor=INK)


def rows_of(ax, rows):
    """Lays out one panel's y axis: headings (client counts, bold) and one row per bar,
    top to bottom."""
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for _, label, *_ in rows])
    for tick, (kind, *_) in zip(ax.get_yticklabels(), rows):
        if kind == "heading":
            tick.set_fontweight("bold")
    ax.set_ylim(len(rows) - 0.5, -0.5)


def figure(heights, title):
    fig = Figure(figsize=(WIDTH, sum(heights) + 0.5), layout="constrained")
    axes = fig.subplots(len(heights), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)
    fig.suptitle(title, x=0.01, ha="left", fontsize=13, fontweight="bold", color=INK)
    return fig, [a[0] for a in axes]


def save(fig, path):
    """Writes the PNG with a palette of 256 colours: a third of the size of matplotlib's
    RGBA for flat bars and text, which look the same (Pillow comes with matplotlib)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    buf.seek(0)
    with Image.open(buf) as im:
        im.convert("RGB").quantize(colors=256, dither=Image.Dither.NONE).save(path, optimize=True)


def panel_targets(name, ref):
    """The targets of this workload measured against the panel's reference, other than
    1× (the 1× line is drawn anyway): (goal, systems). The heartbeat's target is against
    the bare UPDATE committed the way each row commits, which one line on this panel
    cannot show; the report's targets section has it."""
    out = {}
    for t in TARGETS:
        if t.workload == name and t.metric == "tps" and t.reference == ref and t.goal != 1:
            out.setdefault(t.goal, []).append(SYSTEMS[t.system][0])
    return sorted(out.items())


def chart_throughput(cfg, results, path):
    """One panel per workload: each system's throughput as a multiple of the workload's
    last reference, on a log scale, grouped by client count. Returns whether it drew."""
    panels = []
    for name in PANELS:
        ref = REFERENCES[name][-1]
        rows = []
        systems = [s for s, _, _ in WORKLOADS[name]]
        for clients in cfg.clients:
            f = find(results, name, ref, clients)
            bars = [(s, find(results, name, s, clients)) for s in systems]
            bars = [(s, r) for s, r in bars if r and f]
            if not bars:
                continue
            rows.append(("heading", clients_heading(clients)))
            rows += [("bar", SYSTEMS[s][0], s, r["tps"] / f["tps"], r["tps"]) for s, r in bars]
        if rows:
            panels.append((name, ref, rows))
    if not panels:
        return False
    fig, axes = figure([len(rows) * ROW + PANEL for _, _, rows in panels],
                       "lockext side by side: throughput, log scale (1× = the reference named "
                       "in each panel's title)")
    for ax, (name, ref, rows) in zip(axes, panels):
        ax.set_xscale("log")
        style(ax)
        rows_of(ax, rows)
        for y, (kind, label, *bar) in enumerate(rows):
            if kind != "bar":
                continue
            system, v, tps = bar
            shown = min(max(v, LO), HI)
            ax.barh(y, shown - LO, left=LO, height=0.72, color=SYSTEMS[system][1])
            ax.text(shown * 1.06, y, f"{v:.2f}× · {fmt_num(tps)}/s", va="center", fontsize=7.5,
                    color=MUTED, path_effects=HALO)
        ax.axvline(1, color=INK, linewidth=1.3)
        for goal, who in panel_targets(name, ref):
            ax.axvline(goal, color=TARGET, linewidth=1, linestyle=(0, (4, 3)))
            ax.text(goal / 1.04, 0, f"target {goal:g}× for {', '.join(who)}", ha="right",
                    va="center", fontsize=7.5, color=TARGET, path_effects=HALO)
        ax.set_xlim(LO, HI)
        ax.xaxis.set_major_locator(FixedLocator(TICKS))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda t, _: f"{t:g}×"))
        head = REFERENCE_HEADS.get(name, ("× floor",))[-1]
        ax.set_title(THROUGHPUT_TITLES[name], loc="left", fontsize=10.5, fontweight="bold",
                     color=INK)
        ax.set_xlabel(f"{UNITS[name]} {head}", fontsize=8, color=MUTED)
    save(fig, path)
    return True


def log_ticks(lo, hi):
    """1, 2 and 5 times the powers of ten from lo to hi."""
    out, t = [], lo
    while t <= hi * 1.0001:
        out += [round(t * m, 6) for m in (1, 2, 5) if t * m <= hi * 1.0001]
        t *= 10
    return out


def chart_latency(cfg, results, path):
    """The cycle's p50 (dark) and p99 (light) by system and client count, on a log scale,
    and lockext's cycle p99 against the number of live leases in its table (the scale
    workload), one line per client count and mode. Returns whether it drew."""
    cycle = [r for r in results if r["workload"] == "cycle"]
    scale = [r for r in results if r["workload"] == "scale"]
    rows = []
    systems = [s for s, _, _ in WORKLOADS["cycle"] if any(r["system"] == s for r in cycle)]
    for clients in cfg.clients:
        pts = [find(results, "cycle", s, clients) for s in systems]
        pts = [p for p in pts if p]
        if pts:
            rows.append(("heading", clients_heading(clients)))
            rows += [("bar", p["label"], p) for p in pts]
    vals = [p[k] for _, _, *rest in rows for p in rest for k in ("p50", "p99") if p[k] > 0]
    heights = []
    if vals:
        heights.append(len(rows) * ROW + PANEL)
    if scale:
        heights.append(2.6)
    if not heights:
        return False
    fig, axes = figure(heights, "lockext benchmarks: latency")
    axes = iter(axes)
    if vals:
        ax = next(axes)
        lo = 10 ** math.floor(math.log10(min(vals)))
        hi = max(vals) * 4  # room for the labels right of the longest bar
        ax.set_xscale("log")
        style(ax)
        rows_of(ax, rows)
        for y, (kind, _, *rest) in enumerate(rows):
            if kind != "bar":
                continue
            p = rest[0]
            colour = SYSTEMS[p["system"]][1]
            # log scale: a value below the axis (0) is drawn as no bar, not a negative one
            ax.barh(y, max(p["p99"], lo) - lo, left=lo, height=0.8, color=colour, alpha=0.35)
            ax.barh(y, max(p["p50"], lo) - lo, left=lo, height=0.4, color=colour)
            ax.text(p["p99"] * 1.08, y, f"{fmt_ms(p['p50'])} / {fmt_ms(p['p99'])} ms",
                    va="center", fontsize=7.5, color=MUTED, path_effects=HALO)
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_locator(FixedLocator(log_ticks(lo, hi)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda t, _: f"{t:g}"))
        ax.set_title("Cycle latency: p50 (dark) and p99 (light), ms, log scale", loc="left",
                     fontsize=10.5, fontweight="bold", color=INK)
        ax.set_xlabel("ms per cycle (acquire + release)", fontsize=8, color=MUTED)
    if scale:
        ax = next(axes)
        sizes = sorted({r["leases"] for r in scale})
        style(ax)
        ax.grid(axis="y", color=GRID, linewidth=0.8)
        for ci, clients in enumerate(cfg.clients):
            for system, dash in (("lockext", "-"), ("lockext_epoch", "--")):
                line = sorted((r for r in scale if r["clients"] == clients and r["system"] == system),
                              key=lambda r: r["leases"])
                if not line:
                    continue
                ax.plot([sizes.index(r["leases"]) for r in line], [r["p99"] for r in line],
                        linestyle=dash, marker="o", markersize=4, linewidth=2,
                        color=SHADES[ci % len(SHADES)],
                        label=f"{clients_heading(clients)}"
                              f"{', epoch mode' if system == 'lockext_epoch' else ''}")
        ax.set_xticks(range(len(sizes)))
        ax.set_xticklabels([f"{num(s)} leases" for s in sizes])
        ax.set_xlim(-0.3, len(sizes) - 0.7)
        ax.set_ylim(0, max(r["p99"] for r in scale) * 1.15)
        ax.set_ylabel("cycle p99, ms", fontsize=8, color=MUTED)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
        ax.set_title("Scale: lockext cycle p99 (ms) against live leases in the table", loc="left",
                     fontsize=10.5, fontweight="bold", color=INK)
    save(fig, path)
    return True


CHARTS = (("-throughput.png", chart_throughput), ("-latency.png", chart_latency))
