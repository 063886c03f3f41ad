#!/usr/bin/env python3
"""loadtest/chart.py: the chart next to bench.sh's (and compare.sh's) markdown table.

Reads rows "pass<TAB>stage<TAB>concurrency<TAB>infer/s<TAB>p99 µs" (bench.sh writes them) and
draws, for each pass (compare.sh has one, "wrk"), throughput and p99 against concurrency, one
line per stage, as one SVG.
Standard library only, so the benchmark needs nothing the test setup does not install.

    python3 loadtest/chart.py rows.tsv out.svg "title"
"""
import sys
from collections import defaultdict
from xml.sax.saxutils import escape

COLOURS = {"direct": "#7f7f7f", "nginx": "#2ca02c", "floor": "#9467bd", "ig-off": "#1f77b4", "ig-val": "#ff7f0e",
           "ig-on": "#d62728"}
LABELS = {"direct": "direct", "nginx": "nginx", "floor": "floor (bare hyper proxy)", "ig-off": "infergate, validation off",
          "ig-val": "infergate, validation on", "ig-on": "infergate, everything on"}
PASSES = {"fake": "pass 1: fake-triton backend", "real": "pass 2: real Triton",
          "wrk": "wrk, proxy pinned"}
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 360, 240, 64, 16, 34, 42


def ticks(top):
    """About five round tick values from 0 to at least `top`."""
    if top <= 0:
        return [0, 1]
    raw = top / 5
    magnitude = 10 ** (len(str(int(raw))) - 1) if raw >= 1 else 1
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    values, v = [], 0
    while v < top + step:
        values.append(v)
        v += step
    return values


def panel(x0, y0, title, unit, series, levels):
    """One plot: x is the concurrency level's index (the levels are 1, 16, 64: not linear)."""
    out = []
    top = max((v for points in series.values() for _, v in points), default=1)
    ys = ticks(top)
    ymax = ys[-1] or 1
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    def px(i):
        return x0 + PAD_L + (pw * (i + 0.5) / len(levels))
    def py(v):
        return y0 + PAD_T + ph - ph * v / ymax
    out.append(f'<text x="{x0 + W / 2}" y="{y0 + 18}" text-anchor="middle" font-weight="bold">{escape(title)}</text>')
    for v in ys:
        y = py(v)
        out.append(f'<line x1="{x0 + PAD_L}" x2="{x0 + W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        label = f"{v / 1000:g}k" if ymax >= 10000 else f"{v:g}"
        out.append(f'<text x="{x0 + PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    for i, c in enumerate(levels):
        out.append(f'<text x="{px(i):.1f}" y="{y0 + H - PAD_B + 16}" text-anchor="middle">{c}</text>')
    out.append(f'<text x="{x0 + PAD_L + pw / 2}" y="{y0 + H - 8}" text-anchor="middle">concurrency</text>')
    out.append(f'<text transform="translate({x0 + 14},{y0 + PAD_T + ph / 2}) rotate(-90)" text-anchor="middle">{escape(unit)}</text>')
    for stage, points in series.items():
        coords = [(px(levels.index(c)), py(v)) for c, v in sorted(points)]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        colour = COLOURS.get(stage, "#000")
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in coords)
    return out


def main():
    rows_path, out_path, title = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""
    data = defaultdict(lambda: {"rps": defaultdict(list), "p99": defaultdict(list)})
    for line in open(rows_path, encoding="utf-8"):
        if not line.strip():
            continue
        pass_, stage, c, rps, p99 = line.rstrip("\n").split("\t")
        data[pass_]["rps"][stage].append((int(c), float(rps)))
        data[pass_]["p99"][stage].append((int(c), float(p99) / 1000))
    passes = [p for p in PASSES if p in data] + [p for p in data if p not in PASSES]
    legend_h = 28
    width, height = 2 * W, 30 + legend_h + H * len(passes)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="13">{escape(title)}</text>']
    x = 10
    present = {stage for p in data for stage in data[p]["rps"]}
    for stage in (s for s in COLOURS if s in present):
        svg.append(f'<rect x="{x}" y="32" width="14" height="4" fill="{COLOURS[stage]}"/>')
        svg.append(f'<text x="{x + 18}" y="38">{escape(LABELS[stage])}</text>')
        x += 30 + 6.2 * len(LABELS[stage])
    for row, p in enumerate(passes):
        levels = sorted({c for pts in data[p]["rps"].values() for c, _ in pts})
        y0 = 30 + legend_h + row * H
        name = PASSES.get(p, p)
        svg += panel(0, y0, f"{name}: throughput", "infer/s", data[p]["rps"], levels)
        svg += panel(W, y0, f"{name}: p99 latency", "p99 ms", data[p]["p99"], levels)
    svg.append("</svg>")
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
