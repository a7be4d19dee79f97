#!/usr/bin/env python3
"""The Grafana dashboard's panels without Grafana or Prometheus.

`record` scrapes a gateway's /metrics (the operations listener) at a fixed interval for a
bounded time and keeps every scrape; `render` draws each panel of
config/grafana/flashgate.json from those scrapes into one self-contained HTML page of SVG
charts. Each panel query is read for what it needs: the metric, the label matchers, the
`by (...)` grouping and whether it is a rate, an increase, a quantile of a histogram or a
plain value. `rate` is drawn per second between consecutive scrapes, `increase(...[1h])`
as the increase since the recording started, `histogram_quantile` from the buckets'
increase between scrapes. A query made of more than one selector (a ratio, `deriv`) is
drawn as the series it is computed from, and the panel says so. Grafana variables
(`$instance`, `$deal`) select everything.

    scripts/dashboard.py record --metrics-url http://127.0.0.1:8081/metrics \\
        --seconds 60 --out target/dashboard/scrapes.jsonl
    scripts/dashboard.py render --scrapes target/dashboard/scrapes.jsonl \\
        --out target/dashboard/index.html
    scripts/dashboard.py panels      # the panel table of docs/DASHBOARD.md

Only the Python standard library is used.
"""

import argparse
import html
import json
import math
import pathlib
import re
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "config" / "grafana" / "flashgate.json"

# Bounds of a recording: an hour at most, scrapes no closer than 0.2 s.
RECORD_SECONDS_MAX = 3600
INTERVAL_SECONDS_MIN = 0.2
SCRAPE_TIMEOUT_SECONDS = 5

WIDTH, HEIGHT = 440, 200
LEFT, RIGHT, TOP, BOTTOM = 60, 10, 10, 30
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
          "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
SERIES_MAX = len(COLORS)

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
SELECTOR = re.compile(r'\b([a-z_:][a-z0-9_:]*)\{([^}]*)\}')
BARE_METRIC = re.compile(r'\b((?:flashgate|process)_[a-z0-9_]+)\b(?!\s*\()')
QUANTILE = re.compile(r'^histogram_quantile\(\s*([0-9.]+)\s*,')
GROUPING = re.compile(r'^(sum|max|min|count|avg)\s*(?:by\s*\(([^)]*)\))?\s*\(')


def parse_exposition(text):
    """Samples of a Prometheus text exposition: [name, {label: value}, value]."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        if not match:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\")
                  for k, v in LABEL.findall(match.group(3) or "")}
        try:
            value = float(match.group(4))
        except ValueError:
            continue
        samples.append([match.group(1), labels, value])
    return samples


def record(args):
    seconds = min(args.seconds, RECORD_SECONDS_MAX)
    interval = max(args.interval, INTERVAL_SECONDS_MIN)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + seconds
    count = 0
    with out.open("w") as sink:
        while True:
            started = time.monotonic()
            try:
                with urllib.request.urlopen(args.metrics_url, timeout=SCRAPE_TIMEOUT_SECONDS) as answer:
                    text = answer.read().decode()
                sink.write(json.dumps({"t": time.time(), "samples": parse_exposition(text)}) + "\n")
                sink.flush()
                count += 1
            except OSError as error:
                print(f"dashboard: scrape failed: {error}", file=sys.stderr)
            if started + interval > deadline:
                break
            time.sleep(max(0.0, started + interval - time.monotonic()))
    print(f"dashboard: {count} scrapes of {args.metrics_url} in {out}", file=sys.stderr)
    return 0 if count >= 2 else 1


# ------------------------------------------------------------------ reading the queries

def matchers(text):
    """Label matchers with fixed values (`=` and `!=`); Grafana variables select all."""
    found = []
    for part in re.findall(r'([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"', text):
        name, op, value = part
        if "$" in value:
            continue
        found.append((name, op, value))
    return found


def understand(expr):
    """What one panel query asks for, as far as drawing it goes."""
    expr = expr.strip()
    query = {"quantile": None, "kind": "value", "by": None, "agg": "sum", "exact": True}
    quantile = QUANTILE.match(expr)
    if quantile:
        query["quantile"] = float(quantile.group(1))
        expr = expr[quantile.end():].strip()
    grouping = GROUPING.match(expr)
    if grouping:
        query["agg"] = grouping.group(1)
        if grouping.group(2) is not None:
            query["by"] = [l.strip() for l in grouping.group(2).split(",") if l.strip() and l.strip() != "le"]
    if "rate(" in expr:
        query["kind"] = "rate"
    elif "increase(" in expr:
        query["kind"] = "increase"
    selectors = SELECTOR.findall(expr)
    names = [name for name, _ in selectors] + BARE_METRIC.findall(SELECTOR.sub("", expr))
    if not names:
        return None
    query["metric"] = names[0]
    query["matchers"] = matchers(selectors[0][1]) if selectors else []
    query["exact"] = len(names) == 1 and "deriv(" not in expr
    if query["quantile"] is not None:
        query["metric"] = re.sub(r"_bucket$", "", query["metric"]) + "_bucket"
    return query


def selected(labels, wanted):
    for name, op, value in wanted:
        have = labels.get(name, "")
        if op == "=" and have != value or op == "!=" and have == value:
            return False
        if op == "=~" and not re.fullmatch(value, have) or op == "!~" and re.fullmatch(value, have):
            return False
    return True


def group_key(labels, by):
    """The labels a series keeps after `by (...)`: a tuple of (name, value)."""
    return tuple((l, labels.get(l, "")) for l in by or [])


def legend(group, template):
    """A series' name: the query's legendFormat with `{{label}}` filled in, or its labels."""
    if template:
        values = dict(group)
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: values.get(m.group(1), ""), template)
    return ", ".join(f"{name}={value}" for name, value in group) or "all"


def aggregate(values, agg):
    if agg == "max":
        return max(values)
    if agg == "min":
        return min(values)
    if agg == "count":
        return float(len(values))
    if agg == "avg":
        return sum(values) / len(values)
    return sum(values)


def per_series(scrape, query):
    """{(group, le): [values]} of one scrape's matching samples."""
    grouped = {}
    for name, labels, value in scrape["samples"]:
        if name != query["metric"] or not selected(labels, query["matchers"]):
            continue
        key = (group_key(labels, query["by"]), labels.get("le"))
        grouped.setdefault(key, []).append(value)
    return grouped


def quantile_of(buckets, q):
    """histogram_quantile over {le: cumulative count}, linear within a bucket."""
    bounds = sorted(buckets, key=lambda le: math.inf if le == "+Inf" else float(le))
    total = buckets[bounds[-1]] if bounds else 0
    if total <= 0:
        return None
    rank, below, lower = q * total, 0.0, 0.0
    for le in bounds:
        upper = math.inf if le == "+Inf" else float(le)
        count = buckets[le]
        if count >= rank:
            if upper == math.inf:
                return lower
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        below, lower = count, upper
    return lower


def series_of(scrapes, query):
    """{group labels: [(seconds since the first scrape, value)]} for one query."""
    start = scrapes[0]["t"]
    folded = [(s["t"] - start, {k: aggregate(v, query["agg"]) for k, v in per_series(s, query).items()})
              for s in scrapes]
    lines = {}
    if query["kind"] == "value":
        for t, groups in folded:
            for (group, _), value in groups.items():
                lines.setdefault(group, []).append((t, value))
        return lines
    first = folded[0][1]
    for (t0, before), (t1, after) in zip(folded, folded[1:]):
        width = max(t1 - t0, 1e-9)
        change = {k: max(0.0, v - before.get(k, 0.0)) for k, v in after.items()}
        if query["quantile"] is not None:
            by_group = {}
            for (group, le), delta in change.items():
                by_group.setdefault(group, {})[le] = delta
            for group, buckets in by_group.items():
                value = quantile_of(buckets, query["quantile"])
                if value is not None:
                    lines.setdefault(group, []).append((t1, value))
        elif query["kind"] == "rate":
            for (group, _), delta in change.items():
                lines.setdefault(group, []).append((t1, delta / width))
        else:
            for (group, _), value in after.items():
                lines.setdefault(group, []).append((t1, value - first.get((group, None), 0.0)))
    return lines


# ------------------------------------------------------------------ drawing

def ticks(low, high, count=4):
    if high <= low:
        high = low + 1
    step = 10 ** math.floor(math.log10((high - low) / count))
    for factor in (1, 2, 5, 10):
        if (high - low) / (step * factor) <= count:
            step *= factor
            break
    first = math.floor(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 2) if first + i * step <= high + 1e-9]


def number(value):
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:.3g}"


def chart(lines, seconds):
    """An SVG line chart of {legend: points} over `seconds`."""
    values = [v for points in lines.values() for _, v in points]
    if not values:
        return '<p class="empty">no samples of this query in the recording</p>'
    low, high = min(0.0, min(values)), max(values)
    high = high if high > low else low + 1
    x = lambda t: LEFT + (WIDTH - LEFT - RIGHT) * t / max(seconds, 1e-9)
    y = lambda v: TOP + (HEIGHT - TOP - BOTTOM) * (1 - (v - low) / (high - low))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img">']
    for v in ticks(low, high):
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
                     f'<text x="{LEFT - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{number(v)}</text>')
    for t in ticks(0, seconds):
        parts.append(f'<text x="{x(t):.1f}" y="{HEIGHT - 10}" text-anchor="middle">{number(t)} s</text>')
    for color, (name, points) in zip(COLORS, sorted(lines.items())):
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}">'
                     f'<title>{html.escape(name)}</title></polyline>')
    parts.append("</svg>")
    names = "".join(f'<li><span style="background:{c}"></span>{html.escape(name)}</li>'
                    for c, name in zip(COLORS, sorted(lines)))
    more = len(lines) - SERIES_MAX
    if more > 0:
        names += f"<li>… {more} more series not drawn</li>"
    return "".join(parts) + f'<ul class="legend">{names}</ul>'


def panels():
    """(row, panel) of the dashboard in order; panels before any row have row ''."""
    row, found = "", []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        if panel.get("type") == "row":
            row = panel["title"]
        else:
            found.append((row, panel))
    return found


def render_panel(panel, scrapes, seconds):
    lines, notes = {}, []
    for target in panel.get("targets", []):
        query = understand(target["expr"])
        if query is None:
            notes.append(f"not drawn: {target['expr']}")
            continue
        if not query["exact"]:
            notes.append(f"drawn as {query['metric']}, the series this query is computed from")
        for group, points in series_of(scrapes, query).items():
            lines[legend(group, target.get("legendFormat"))] = points
    exprs = "".join(f"<code>{html.escape(t['expr'])}</code>" for t in panel.get("targets", []))
    notes = "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
    return (f'<section class="panel"><h3>{html.escape(panel["title"])}</h3>{chart(lines, seconds)}'
            f"{notes}<details><summary>query</summary>{exprs}</details></section>")


STYLE = """
body { font: 13px sans-serif; margin: 1em; }
h2 { clear: both; margin-top: 1.5em; }
.panel { display: inline-block; vertical-align: top; width: 460px; margin: 0 8px 12px 0; }
.panel h3 { font-size: 14px; margin: 4px 0; }
svg text { font-size: 10px; fill: #444; }
.grid { stroke: #ddd; }
.legend { list-style: none; padding: 0; margin: 2px 0; }
.legend li { display: inline-block; margin-right: 10px; }
.legend span { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
.note, .empty { color: #666; font-style: italic; margin: 2px 0; }
code { display: block; white-space: pre-wrap; font-size: 11px; }
"""


def render(args):
    scrapes = [json.loads(line) for line in pathlib.Path(args.scrapes).read_text().splitlines() if line]
    if len(scrapes) < 2:
        print("dashboard: at least two scrapes are needed to draw rates", file=sys.stderr)
        return 1
    seconds = scrapes[-1]["t"] - scrapes[0]["t"]
    body, row = [], None
    for panel_row, panel in panels():
        if panel_row != row:
            row = panel_row
            body.append(f"<h2>{html.escape(row)}</h2>")
        body.append(render_panel(panel, scrapes, seconds))
    title = json.loads(DASHBOARD.read_text())["title"]
    page = (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p>{len(scrapes)} scrapes over {seconds:.0f} s</p>{''.join(body)}</body></html>\n")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    print(f"dashboard: {out}", file=sys.stderr)
    return 0


def table(_args):
    print("| row | panel |")
    print("|---|---|")
    for row, panel in panels():
        print(f"| {row} | {panel['title']} |")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="scrape /metrics at an interval for a bounded time")
    rec.add_argument("--metrics-url", default="http://127.0.0.1:8081/metrics")
    rec.add_argument("--seconds", type=float, default=60.0,
                     help=f"how long to record (at most {RECORD_SECONDS_MAX})")
    rec.add_argument("--interval", type=float, default=1.0,
                     help=f"seconds between scrapes (at least {INTERVAL_SECONDS_MIN})")
    rec.add_argument("--out", default="target/dashboard/scrapes.jsonl")
    rec.set_defaults(run=record)
    ren = commands.add_parser("render", help="draw every panel from recorded scrapes as HTML")
    ren.add_argument("--scrapes", default="target/dashboard/scrapes.jsonl")
    ren.add_argument("--out", default="target/dashboard/index.html")
    ren.set_defaults(run=render)
    commands.add_parser("panels", help="print the panel table of docs/DASHBOARD.md").set_defaults(run=table)
    args = parser.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
