#!/usr/bin/env python3
"""Adaptive admission against fixed, under a back end slowed part way.

Two gateways on free loopback ports share a fresh database and a fresh Redis key prefix.
Buyers (threads) join the line on either gateway, poll their ticket and order with the
pass as soon as they are admitted (each order on its own thread, so the line keeps
filling while orders wait). Part way through, the script slows the back end below --max
and later lets it go: `--slowdown writer` starts a competing writer on PostgreSQL (pgbench
holding the deal's stock rows locked --hold-ms at a time); `--slowdown serialize` makes
every statement inserting orders wait for one lock and hold it --hold-ms (a trigger in the
run's own database). The same run is made twice: the deal's waiting room `adaptive` between
--min and --max per second with --target-ms, then `fixed` at --max. Every run is bounded
(its phases' seconds) and stops by itself. The goal's figure is the p99 of every order the
admitted buyers sent from 5 s into the slowdown to its end (an error counts as late).

It prints the figures, draws the adaptive run's outflow, order p99 and stock over time
as an SVG (--svg), and rewrites the section between the markers in --doc:

    python3 loadtest/adaptive_run.py --svg docs/adaptive.svg --doc docs/WAITING_ROOM.md

Needs: the workspace's `flashgate` binary (target/debug unless --bin), PostgreSQL and
Redis as for the tests (DATABASE_URL, REDIS_URL), pgbench and psql.
"""

import argparse
import base64
import hashlib
import hmac
import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ORDER_TIMEOUT_S = 30.0
# The goal's span starts this long after the slowdown does.
SETTLE_S = 5
BEGIN = "<!-- adaptive-run:begin -->"
END = "<!-- adaptive-run:end -->"


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(secret, user):
    now = int(time.time())
    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = {"sub": user, "exp": now + 3600, "iss": "flashgate", "aud": "flashgate",
              "iat": now, "nbf": now}
    body = b64(json.dumps(claims).encode())
    mac = hmac.new(secret.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64(mac)}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, headers=None, body=None, timeout=10.0):
    """(status, parsed JSON or None); status 0 on a transport error."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        hdrs = dict(headers or {})
        if payload is not None:
            hdrs["Content-Type"] = "application/json"
        conn.request(method, path, body=payload, headers=hdrs)
        response = conn.getresponse()
        text = response.read()
        try:
            return response.status, json.loads(text) if text else None
        except ValueError:
            return response.status, text.decode(errors="replace")
    except OSError:
        return 0, None
    finally:
        conn.close()


class Fleet:
    """Two gateways on one fresh database and Redis prefix."""

    def __init__(self, args, name):
        self.args = args
        run = f"{name}_{int(time.time())}"
        base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
        self.base_db = base
        self.db_name = f"fg_adaptive_{run}"
        self.db_url = f"{base.rsplit('/', 1)[0]}/{self.db_name}"
        psql(base, f"CREATE DATABASE {self.db_name}")
        self.jwt = "adaptive-jwt-" + secrets.token_hex(16)
        self.admin = "adaptive-admin-" + secrets.token_hex(16)
        env = dict(os.environ)
        env.update({
            "DATABASE_URL": self.db_url,
            "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"),
            "FLASHGATE__REDIS__KEY_PREFIX": f"adaptive{run}:",
            "FLASHGATE_JWT_SECRET": self.jwt,
            "FLASHGATE_ADMIN_TOKEN": self.admin,
            "FLASHGATE__WAITING_ROOM__PASS_SECRET": "adaptive-pass-" + secrets.token_hex(16),
            "FLASHGATE__DATABASE__REQUEST_POOL_MAX": str(args.pool),
            "FLASHGATE__ORDERS__LANES": str(max(1, args.pool - 1)),
            "FLASHGATE__ORDERS__BATCH_MAX": str(args.batch_max),
            "FLASHGATE__WAITING_ROOM__STOCK_REFRESH_MS": "200",
            "FLASHGATE__LIMITS__PER_IP__RATE_PER_SECOND": "1000000",
            "FLASHGATE__LIMITS__PER_IP__BURST": "1000000",
            "FLASHGATE__LIMITS__PER_USER__RATE_PER_SECOND": "1000000",
            "FLASHGATE__LIMITS__PER_USER__BURST": "1000000",
            "FLASHGATE__LIMITS__PER_DEAL__RATE_PER_SECOND": "1000000",
            "FLASHGATE__LIMITS__PER_DEAL__BURST": "1000000",
            "RUST_LOG": "warn",
        })
        if args.cut_to_percent is not None:
            env["FLASHGATE__WAITING_ROOM__ADAPTIVE_CUT_TO_PERCENT"] = str(args.cut_to_percent)
        subprocess.run([args.bin, "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
        self.logs = tempfile.NamedTemporaryFile("w+", prefix="adaptive-gw-", delete=False)
        self.procs, self.ports = [], []
        for _ in range(2):
            port, ops = free_port(), free_port()
            genv = dict(env, FLASHGATE_LISTEN=f"127.0.0.1:{port}",
                        FLASHGATE_OPS_LISTEN=f"127.0.0.1:{ops}")
            self.procs.append(subprocess.Popen([args.bin, "serve"], env=genv,
                                               stdout=self.logs, stderr=self.logs))
            self.ports.append((port, ops))
        for port, _ in self.ports:
            for _ in range(200):
                if request(port, "GET", "/healthz")[0] == 200:
                    break
                time.sleep(0.1)

    def admin_call(self, method, path, body=None):
        auth = {"Authorization": f"Bearer {self.admin}"}
        return request(self.ports[0][1], method, path, auth, body)

    def stop(self):
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        psql(self.base_db, f"DROP DATABASE IF EXISTS {self.db_name} WITH (FORCE)")


def psql(url, sql):
    subprocess.run(["psql", url, "-qAtc", sql], check=True, stdout=subprocess.DEVNULL)


class Competitor:
    """A competing writer on the deal's stock rows, started and stopped by the run.

    pgbench transactions lock every bucket row of the deal (ascending, the lock order the
    gateway keeps, so nothing deadlocks) and hold them `hold_ms`: each reservation waits
    for the hold in progress, so the back end's capacity falls to a few reservations per
    hold and, unlike a CPU load on a shared machine, does not depend on what else runs.
    """

    def __init__(self, db_url, deal, hold_ms):
        self.db_url = db_url
        self.proc = None
        self.script = tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False)
        self.script.write("BEGIN;\n"
                          f"SELECT bucket FROM inventory_buckets WHERE deal_id = '{deal}' "
                          "ORDER BY bucket FOR NO KEY UPDATE;\n"
                          f"SELECT pg_sleep({hold_ms / 1000.0});\n"
                          "COMMIT;\n")
        self.script.close()

    def start(self, clients, seconds):
        self.proc = subprocess.Popen(
            ["pgbench", "-n", "-c", str(clients), "-j", str(clients), "-T", str(seconds),
             "-f", self.script.name, self.db_url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.proc = None
        if os.path.exists(self.script.name):
            os.unlink(self.script.name)


class Serializer:
    """A slowdown of another kind: every statement inserting orders waits for one lock,
    shared by both gateways, and holds it `hold_ms`, so the back end commits one batch per
    hold whatever the rate it is sent (a trigger the run adds to its own database and
    drops when the slowdown ends)."""

    def __init__(self, db_url, _deal, hold_ms):
        self.db_url = db_url
        self.hold_ms = hold_ms

    def start(self, _clients, _seconds):
        psql(self.db_url, f"""
            CREATE OR REPLACE FUNCTION adaptive_run_serialize() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
              PERFORM pg_advisory_xact_lock(7351);
              PERFORM pg_sleep({self.hold_ms / 1000.0});
              RETURN NULL;
            END $$;
            CREATE TRIGGER adaptive_run_serialize BEFORE INSERT ON orders
              FOR EACH STATEMENT EXECUTE FUNCTION adaptive_run_serialize();""")

    def stop(self):
        psql(self.db_url, "SET client_min_messages = warning; "
                          "DROP TRIGGER IF EXISTS adaptive_run_serialize ON orders")


SLOWDOWNS = {"writer": Competitor, "serialize": Serializer}


class Record:
    """What the buyers met, shared by their threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.orders = []  # (t sent, latency s, status, pass held s when answered)
        self.in_flight = []

    def add(self, *row):
        with self.lock:
            self.orders.append(row)

    def track(self, thread):
        with self.lock:
            self.in_flight = [t for t in self.in_flight if t.is_alive()] + [thread]


def place_order(port, deal, headers, record, t0, admitted):
    sent = time.monotonic()
    status, _ = request(port, "POST", f"/v1/deals/{deal}/orders", headers, {"quantity": 1},
                        timeout=ORDER_TIMEOUT_S)
    answered = time.monotonic()
    record.add(sent - t0, answered - sent, status, answered - admitted)


def buyer_lane(fleet, deal, lane, record, t0, stop_at):
    n = 0
    while time.monotonic() < stop_at:
        n += 1
        user = f"l{lane}u{n}"
        port = fleet.ports[(lane + n) % 2][0]
        auth = {"Authorization": f"Bearer {token(fleet.jwt, user)}"}
        status, body = request(port, "POST", f"/v1/deals/{deal}/queue", auth)
        if status != 201 or not isinstance(body, dict):
            time.sleep(0.2)
            continue
        ticket = body["ticket"]
        while time.monotonic() < stop_at and body.get("state") == "waiting":
            time.sleep(0.2)
            status, body = request(port, "GET", f"/v1/deals/{deal}/queue/{ticket}", auth)
            if not isinstance(body, dict):
                body = {"state": "waiting"}
        if body.get("state") != "admitted":
            continue
        admitted = time.monotonic()
        headers = dict(auth, **{"Flashgate-Pass": body["pass"],
                                "Idempotency-Key": secrets.token_hex(8)})
        # The order goes on its own thread and the lane queues the next buyer at once: a
        # crowd does not stop arriving because the admitted ones wait, so a slow back end
        # cannot thin the line and hide what the outflow does to it.
        order = threading.Thread(target=place_order,
                                 args=(port, deal, headers, record, t0, admitted))
        order.start()
        record.track(order)


def metric(port, name, deal):
    status, text = request(port, "GET", "/metrics")
    if status != 200 or not isinstance(text, str):
        return 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'deal="{deal}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def sampler(fleet, deal, t0, stop_at, samples):
    while time.monotonic() < stop_at:
        outflow = max(metric(ops, "flashgate_waiting_room_outflow_per_second", deal)
                      for _, ops in fleet.ports)
        p99 = max(metric(ops, "flashgate_waiting_room_health_p99_seconds", deal)
                  for _, ops in fleet.ports)
        _, inv = fleet.admin_call("GET", f"/admin/deals/{deal}/inventory")
        available = inv.get("available", 0) if isinstance(inv, dict) else 0
        samples.append((time.monotonic() - t0, outflow, p99, available))
        time.sleep(0.25)


def one_run(args, mode):
    fleet = Fleet(args, mode)
    competitor = None
    try:
        admission = {"mode": mode, "min_per_second": args.min, "max_per_second": args.max,
                     "target_p99_ms": args.target_ms}
        deal_body = {"id": f"adaptive-{mode}", "name": "Adaptive run", "stock": args.stock,
                     "buckets": 4, "unit_price_minor": 1000, "currency": "EUR",
                     "per_user_limit": 1, "reservation_ttl_seconds": 600,
                     "waiting_room": {"enabled": True, "admit_per_second": args.max,
                                      "max_active": 100000, "pass_ttl_seconds": 60,
                                      "admission": admission}}
        status, body = fleet.admin_call("POST", "/admin/deals", deal_body)
        if status != 201:
            sys.exit(f"adaptive_run: deal not created: {status} {body}")
        deal = body["id"]
        competitor = SLOWDOWNS[args.slowdown](fleet.db_url, deal, args.hold_ms)
        total = args.before + args.slow + args.after
        t0 = time.monotonic()
        stop_at = t0 + total
        record, samples = Record(), []
        threads = [threading.Thread(target=buyer_lane,
                                    args=(fleet, deal, lane, record, t0, stop_at))
                   for lane in range(args.lanes)]
        threads.append(threading.Thread(target=sampler, args=(fleet, deal, t0, stop_at, samples)))
        for thread in threads:
            thread.start()
        time.sleep(args.before)
        competitor.start(args.load_clients, args.slow)
        time.sleep(args.slow)
        competitor.stop()
        for thread in threads:
            thread.join(timeout=total + 30)
        with record.lock:
            in_flight = list(record.in_flight)
        for thread in in_flight:
            thread.join(timeout=ORDER_TIMEOUT_S + 5)
        verdict = audit(fleet, deal)
        return summarize(args, mode, record, samples, verdict)
    finally:
        if competitor:
            competitor.stop()
        fleet.stop()


def audit(fleet, deal):
    """Oversell and acknowledged orders, from PostgreSQL through the invariant audit."""
    _, inv = fleet.admin_call("GET", f"/admin/deals/{deal}/inventory")
    _, audited = fleet.admin_call("GET", "/admin/audit")
    findings = audited.get("findings", []) if isinstance(audited, dict) else ["no audit"]
    return {"invariant_holds": isinstance(inv, dict) and inv.get("invariant_holds") is True,
            "sold": inv.get("sold", 0) + inv.get("reserved", 0) if isinstance(inv, dict) else 0,
            "findings": len(findings)}


def p99(values):
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.99 + 0.999999) - 1)]


def summarize(args, mode, record, samples, verdict):
    target = args.target_ms / 1000.0
    start, end = args.before, args.before + args.slow
    orders = record.orders
    created = [o for o in orders if o[2] == 201]
    errors = [o for o in orders if o[2] not in (201, 409)]
    late = [o for o in created if o[1] > target]
    hurt = [o for o in orders if o[2] not in (201, 409) or o[1] > target]
    all_503 = [o for o in orders if o[2] == 503]
    held_503 = [o for o in all_503 if o[3] > 1.0]
    before = [outflow for t, outflow, _, _ in samples if t < start]
    reference = before[-1] if before else args.max
    cut_at = next((t for t, outflow, _, _ in samples
                   if t >= start and outflow < 0.9 * reference), None)
    back_at = next((t for t, outflow, _, _ in samples
                    if t >= end and outflow >= 0.8 * args.max), None)
    windows = {}
    for o in created:
        windows.setdefault(int(o[0]), []).append(o[1])
    slowed = [sec for sec in range(start, end)]
    over = [sec for sec in slowed if sec in windows and p99(windows[sec]) > target]
    crossed = over[0] if over else None
    # After the p99 first went over the target: the end of the first one-second window back
    # under it (a window with no 201 at all does not count as under).
    recovered = None
    if crossed is not None:
        recovered = next((sec + 1 for sec in sorted(windows)
                          if sec > crossed and p99(windows[sec]) <= target), None)
    in_slow = [o for o in created if start <= o[0] < end]
    # Every order an admitted buyer sent from 5 s into the slowdown to its end; one not
    # answered 201 or 409 counts as late.
    settled = [o[1] if o[2] in (201, 409) else float("inf")
               for o in orders if start + SETTLE_S <= o[0] < end]
    return {
        "mode": mode, "orders": len(orders), "created": len(created), "errors": len(errors),
        "late": len(late), "hurt": len(hurt), "all_503": len(all_503),
        "held_503": len(held_503),
        "rate_before": len([o for o in created if o[0] < start]) / max(start, 1),
        "rate_slow": len([o for o in created if start <= o[0] + o[1] < end]) / max(args.slow, 1),
        "p99_s": p99([o[1] for o in created]),
        "p99_slow_s": p99([o[1] for o in in_slow]),
        "p99_settled_s": p99(settled), "settled_orders": len(settled),
        "settled_late": len([x for x in settled if x > target]),
        "reference": reference,
        "cut_after_s": None if cut_at is None else cut_at - start,
        "cut_after_cross_s": None if cut_at is None or crossed is None else cut_at - crossed,
        "crossed_after_s": None if crossed is None else crossed - start,
        "under_after_start_s": None if recovered is None else recovered - start,
        "under_after_cross_s": None if recovered is None else recovered - crossed,
        "windows_over": len(over), "windows_slow": len(slowed),
        "climb_after_s": None if back_at is None else back_at - end,
        "sold": verdict["sold"], "acked_in_db": verdict["sold"] >= len(created),
        "invariant_holds": verdict["invariant_holds"], "findings": verdict["findings"],
        "samples": samples, "created_rows": [(o[0], o[1]) for o in created],
        "orders_rows": orders,
    }


def fmt(value, unit="s"):
    return "—" if value is None else f"{value:.1f} {unit}"


def table(args, runs, command):
    a, f = runs
    ms = lambda run, key: f"{run[key] * 1000:.0f} ms"
    settled = lambda run: ("an error" if run["p99_settled_s"] == float("inf")
                           else ms(run, "p99_settled_s"))
    rows = [
        ("orders sent by admitted buyers", a["orders"], f["orders"]),
        ("201 created", a["created"], f["created"]),
        ("201 answered per second before the slowdown / while slowed",
         f"{a['rate_before']:.1f} / {a['rate_slow']:.1f}",
         f"{f['rate_before']:.1f} / {f['rate_slow']:.1f}"),
        ("errors (not 201 or 409 sold out)", a["errors"], f["errors"]),
        (f"201 slower than the {args.target_ms} ms target", a["late"], f["late"]),
        ("**admitted buyers who met an error or waited past the target**",
         f"**{a['hurt']}**", f"**{f['hurt']}**"),
        ("503 to a buyer holding a pass (all / answered > 1 s after the pass)",
         f"{a['all_503']} / {a['held_503']}", f"{f['all_503']} / {f['held_503']}"),
        ("201 p99 over the run", ms(a, "p99_s"), ms(f, "p99_s")),
        ("201 p99 while slowed", ms(a, "p99_slow_s"), ms(f, "p99_slow_s")),
        (f"**p99 of the orders sent from {SETTLE_S} s into the slowdown to its end** "
         "(errors count as late; orders, late)",
         f"**{settled(a)}** ({a['settled_orders']}, {a['settled_late']})",
         f"**{settled(f)}** ({f['settled_orders']}, {f['settled_late']})"),
        ("outflow cut below 90% of its value at the slowdown's start, after that start / "
         "after the first 1 s window over the target began",
         f"{fmt(a['cut_after_s'])} / {fmt(a['cut_after_cross_s'])}", "fixed"),
        ("first 1 s window with the 201 p99 over the target, after the slowdown's start",
         fmt(a["crossed_after_s"]), fmt(f["crossed_after_s"])),
        ("201 p99 back under the target (end of the first 1 s window under it), "
         "after the slowdown's start / after that first window over",
         f"{fmt(a['under_after_start_s'])} / {fmt(a['under_after_cross_s'])}",
         f"{fmt(f['under_after_start_s'])} / {fmt(f['under_after_cross_s'])}"),
        ("1 s windows of the slowdown with the 201 p99 over the target",
         f"{a['windows_over']} of {a['windows_slow']}",
         f"{f['windows_over']} of {f['windows_slow']}"),
        ("outflow within 20% of max after the slowdown ended", fmt(a["climb_after_s"]),
         "fixed"),
        ("units sold or reserved (PostgreSQL)", a["sold"], f["sold"]),
        ("every 201 in PostgreSQL", a["acked_in_db"], f["acked_in_db"]),
        ("invariant holds (no oversell), audit findings",
         f"{a['invariant_holds']}, {a['findings']}",
         f"{f['invariant_holds']}, {f['findings']}"),
    ]
    lines = [BEGIN, "",
             f"Measured with `{command}` on {os.cpu_count()} CPUs shared with other work: "
             f"{args.lanes} buyer lanes, two gateways (request pool {args.pool}, "
             f"reservation batches of at most {args.batch_max}: a small back end on purpose), "
             f"{args.before} s healthy, {args.slow} s {slowdown(args)}, "
             f"{args.after} s after; adaptive between {args.min} and {args.max}/s, "
             f"target p99 {args.target_ms} ms, "
             f"`waiting_room.adaptive_cut_to_percent` {args.cut_to_percent or 'at its default'}, "
             f"against fixed at {args.max}/s. "
             f"Chart: `{args.svg}`.", "",
             "| | adaptive | fixed |", "|---|---|---|"]
    lines += [f"| {name} | {x} | {y} |" for name, x, y in rows]
    return "\n".join(lines + ["", END])


def slowdown(args):
    if args.slowdown == "serialize":
        return (f"with every order statement serialized behind one lock held "
                f"{args.hold_ms} ms")
    return (f"with a competing writer holding the deal's stock rows {args.hold_ms} ms at a "
            f"time ({args.load_clients} pgbench client)")


def rewrite(doc, section):
    with open(doc) as f:
        text = f.read()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with open(doc, "w") as f:
        f.write(text)


def per_second_p99(run):
    per_second = {}
    for t, latency in run["created_rows"]:
        per_second.setdefault(int(t), []).append(latency)
    return [(s + 0.5, p99(v) * 1000) for s, v in sorted(per_second.items())]


def svg(args, runs, path):
    """Outflow, order p99 (per second, 201s) and stock over the adaptive run, the fixed
    run's p99 beside it (clipped at the panel's top)."""
    run, fixed = runs
    width, height, left, top, plot_h, gap = 900, 580, 70, 50, 130, 45
    total = args.before + args.slow + args.after
    xs = lambda t: left + (width - left - 20) * min(max(t, 0), total) / total
    clip = args.target_ms * 8
    series = [
        ("outflow (tickets/s)", [(t, o) for t, o, _, _ in run["samples"]], "#1f77b4",
         [(args.max, "max"), (args.min, "min")], [], None),
        (f"201 p99 per second (ms): adaptive red, fixed grey (clipped at {clip} ms)",
         per_second_p99(run), "#d62728", [(args.target_ms, "target")],
         per_second_p99(fixed), clip),
        ("units available", [(t, a) for t, _, _, a in run["samples"]], "#2ca02c", [], [],
         None),
    ]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18" font-size="13">Adaptive admission: outflow, order p99 '
           f'and stock; shaded: stock rows held by a competing writer</text>']
    for i, (name, points, color, marks, beside, ceiling) in enumerate(series):
        y0 = top + i * (plot_h + gap)
        top_value = max([v for _, v in points + beside] + [m for m, _ in marks] + [1]) * 1.1
        if ceiling is not None:
            top_value = min(top_value, ceiling)
        ys = lambda v: y0 + plot_h - plot_h * min(v, top_value) / top_value
        out.append(f'<rect x="{xs(args.before):.1f}" y="{y0}" '
                   f'width="{xs(args.before + args.slow) - xs(args.before):.1f}" '
                   f'height="{plot_h}" fill="#f3e0e0"/>')
        out.append(f'<line x1="{left}" y1="{y0 + plot_h}" x2="{width - 20}" '
                   f'y2="{y0 + plot_h}" stroke="black"/>')
        out.append(f'<line x1="{left}" y1="{y0}" x2="{left}" y2="{y0 + plot_h}" stroke="black"/>')
        out.append(f'<text x="{left}" y="{y0 - 5}">{name}</text>')
        for k in range(5):
            v = top_value * k / 4
            out.append(f'<text x="{left - 5}" y="{ys(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
        for t in range(0, total + 1, 10):
            out.append(f'<text x="{xs(t):.1f}" y="{y0 + plot_h + 14}" '
                       f'text-anchor="middle">{t}s</text>')
        for value, label in marks:
            out.append(f'<line x1="{left}" y1="{ys(value):.1f}" x2="{width - 20}" '
                       f'y2="{ys(value):.1f}" stroke="#888" stroke-dasharray="4 3"/>')
            out.append(f'<text x="{width - 22}" y="{ys(value) - 3:.1f}" '
                       f'text-anchor="end" fill="#555">{label}</text>')
        if beside:
            path_d = " ".join(f"{xs(t):.1f},{ys(v):.1f}" for t, v in beside)
            out.append(f'<polyline fill="none" stroke="#999" stroke-width="1.2" '
                       f'points="{path_d}"/>')
        if points:
            path_d = " ".join(f"{xs(t):.1f},{ys(v):.1f}" for t, v in points)
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                       f'points="{path_d}"/>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def alone(args, run):
    """The goal's figures of one adaptive run, and its late orders (sent s, waited s)."""
    start, end, target = args.before, args.before + args.slow, args.target_ms / 1000.0
    late = [(round(sent - start, 2), round(waited, 3), status)
            for sent, waited, status, _ in run["orders_rows"]
            if start + SETTLE_S <= sent < end and (status not in (201, 409) or waited > target)]
    keys = ("p99_settled_s", "settled_orders", "settled_late", "cut_after_s", "climb_after_s",
            "rate_slow", "held_503", "invariant_holds", "findings", "acked_in_db")
    return dict({key: run[key] for key in keys}, late_orders=sorted(late))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default="target/debug/flashgate")
    parser.add_argument("--lanes", type=int, default=60)
    parser.add_argument("--stock", type=int, default=6000)
    parser.add_argument("--min", type=int, default=4)
    parser.add_argument("--max", type=int, default=60)
    parser.add_argument("--target-ms", type=int, default=250)
    parser.add_argument("--pool", type=int, default=2)
    parser.add_argument("--batch-max", type=int, default=1)
    parser.add_argument("--load-clients", type=int, default=1)
    parser.add_argument("--hold-ms", type=int, default=80)
    parser.add_argument("--slowdown", choices=sorted(SLOWDOWNS), default="writer",
                        help="writer: a competing writer holds the deal's stock rows; "
                             "serialize: every order statement waits for one lock")
    parser.add_argument("--cut-to-percent", type=int, default=None,
                        help="waiting_room.adaptive_cut_to_percent of the gateways, "
                             "else their default")
    parser.add_argument("--before", type=int, default=15)
    parser.add_argument("--slow", type=int, default=20)
    parser.add_argument("--after", type=int, default=20)
    parser.add_argument("--svg", default="docs/adaptive.svg")
    parser.add_argument("--doc", default=None)
    parser.add_argument("--raw", default=None, help="write the samples and orders as JSON")
    parser.add_argument("--adaptive-only", action="store_true",
                        help="run the adaptive line alone and print its figures as JSON "
                             "(no fixed run, chart or table)")
    args = parser.parse_args()
    if args.before + args.slow + args.after > 150:
        sys.exit("adaptive_run: at most 150 s per run")
    for tool in ("pgbench", "psql", args.bin):
        if not shutil.which(tool):
            sys.exit(f"adaptive_run: {tool} is missing (bash scripts/services.sh installs "
                     "PostgreSQL with pgbench; build the gateway with cargo build)")
    shown = [a for a in sys.argv[1:] if a != "--raw" and a != args.raw]
    command = "python3 loadtest/adaptive_run.py " + " ".join(shown)
    if args.adaptive_only:
        print(json.dumps(alone(args, one_run(args, "adaptive"))))
        return
    runs = [one_run(args, "adaptive"), one_run(args, "fixed")]
    svg(args, runs, args.svg)
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump(runs, f)
    section = table(args, runs, command.strip())
    print(section)
    if args.doc:
        rewrite(args.doc, section)


if __name__ == "__main__":
    main()
