# The Worker served locally by workerd, Cloudflare's open-source Workers runtime (npm package
# `workerd`, pinned in package.json), as the tests run it:
#
#   FLASHGATE_EDGE_ORIGIN=http://127.0.0.1:8080 \
#   node_modules/.bin/workerd serve --experimental workerd.capnp \
#       --socket-addr http=127.0.0.1:8787 --directory-path edge-cache=/tmp/flashgate-edge-cache
#
# ORIGIN, the Worker's one binding, is read from FLASHGATE_EDGE_ORIGIN. The Cache API
# (`caches.default`) is backed by workerd's `cache` service, entries on disk for as long as
# their Cache-Control allows (it needs --experimental); on Cloudflare the data centre's cache
# takes its place. docs/EDGE.md says more.

using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
    (name = "edge", worker = .edge),
    (name = "edge-cache", cache = ()),
    # The origin is a private address in tests and local runs.
    (name = "internet", network = (allow = ["public", "private", "local"])),
  ],
  sockets = [
    (name = "http", address = "127.0.0.1:8787", http = (), service = "edge"),
  ],
);

const edge :Workerd.Worker = (
  modules = [(name = "worker.js", esModule = embed "worker.js")],
  compatibilityDate = "2026-11-01",
  bindings = [(name = "ORIGIN", fromEnvironment = "FLASHGATE_EDGE_ORIGIN")],
  cacheApiOutbound = "edge-cache",
);
