#!/usr/bin/env python3
"""Measures what the waiting room costs Redis, with the gateway's own Lua scripts.

Starts a private redis-server on a free loopback port (no persistence), issues N tickets on
one line with the JOIN script and polls every other one with the POLL script, both read from
src/waiting_room/scripts.rs, then reports the memory one waiting ticket holds and the Redis
CPU one poll takes (INFO memory / INFO commandstats). The server is stopped at the end.

Usage: python3 loadtest/redis_costs.py [TICKETS]      (default 100000)
"""

import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY_NAMES = ["meta", "users", "t_user", "t_pos", "t_issue", "t_seen", "t_adm", "t_skip",
             "line", "active", "issued", "used"]


def script(source, name):
    return re.search(r'const %s: &str = r#"(.*?)"#;' % name, source, re.S).group(1)


def resp(args):
    out = ["*%d\r\n" % len(args)]
    for arg in args:
        out.append("$%d\r\n%s\r\n" % (len(arg.encode()), arg))
    return "".join(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(port, *args, stdin=None):
    return subprocess.run(["redis-cli", "-p", str(port), *args], input=stdin, text=True,
                          capture_output=True, check=True).stdout


def main():
    tickets = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    source = open(os.path.join(ROOT, "src/waiting_room/scripts.rs")).read()
    join = script(source, "PRELUDE") + script(source, "JOIN")
    poll = script(source, "PRELUDE") + script(source, "POLL")
    keys = ["flashgate:wr:{deal-1}:%s" % name for name in KEY_NAMES]
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="flashgate-redis-costs.")
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", workdir],
                              stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                cli(port, "ping")
                break
            except subprocess.CalledProcessError:
                time.sleep(0.1)
        used = lambda: int(re.search(r"used_memory:(\d+)", cli(port, "info", "memory")).group(1))
        before = used()
        held = []
        joins = []
        for i in range(tickets):
            user, ticket = "user-%012d" % i, secrets.token_hex(16)
            held.append((user, ticket))
            joins.append(resp(["EVAL", join, str(len(keys))] + keys +
                              [user, ticket, "", "", "604800000"]))
        cli(port, "--pipe", stdin="".join(joins))
        per_ticket = (used() - before) / tickets
        cli(port, "config", "resetstat")
        polls = [resp(["EVAL", poll, str(len(keys))] + keys + [ticket, user])
                 for user, ticket in held[::2]]
        cli(port, "--pipe", stdin="".join(polls))
        stats = re.search(r"cmdstat_eval:calls=(\d+),usec=(\d+)", cli(port, "info", "commandstats"))
        calls, usec = int(stats.group(1)), int(stats.group(2))
        print("tickets %d: %.0f bytes of Redis memory per waiting ticket" % (tickets, per_ticket))
        print("polls %d: %.1f µs of Redis CPU per poll (one EVAL), %d bytes sent per poll"
              % (calls, usec / calls, len(polls[0])))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
