// flashgate at the edge: a Cloudflare Worker in front of the gateway.
//
// Why it exists: a crowd waiting for a sale asks the same public questions over and over
// (the deal, the line's state, the pass keys), and a buyer at the front sends a pass that
// anyone holding the published keys can check. Answering the first from the edge cache and
// refusing bad passes at the edge keeps both off the origin; everything personal (joining,
// a ticket's poll, orders with a good pass, payments) goes to the origin untouched but for
// the client's address.
//
// It needs one binding, ORIGIN: the gateway's base URL (for example
// "https://origin.shop.example"). docs/EDGE.md says how to deploy it, what it decides and
// where it defers to the origin.
//
// What the edge decides about a `Flashgate-Pass`, mirroring the gateway
// (src/waiting_room/pass.rs): an Ed25519 JWS whose header names a published key (`kid`),
// whose signature verifies, whose payload binds this deal (`d`) and has not expired (`e`,
// unix seconds) and whose id (`p`) is not in the revocation feed. A pass it cannot judge
// (an HMAC pass, or one for a deal whose line is not open by the edge's cached copy of the
// public state) goes to the origin, which decides; so does the binding to the user (`u`),
// since a user token is signed with a secret the edge does not hold.

/** Longest pass accepted, as the gateway's PASS_BYTES_MAX; longer is forged. */
const PASS_BYTES_MAX = 1024;
/** Longest key id in a pass header, as the gateway's KID_BYTES_MAX. */
const KID_BYTES_MAX = 64;
/**
 * Seconds a pass may be past its expiry by the edge's clock and still go to the origin
 * rather than be refused here: the edge's clock and the gateway's may differ by this much,
 * and the origin's clock decides a pass that close to its end.
 */
const EXPIRY_SKEW_SECONDS = 5;
/**
 * A pass naming a key the cached key set lacks makes the edge fetch the set from the origin
 * again, at most once per this many milliseconds per isolate, so forged key ids cannot
 * turn into origin traffic.
 */
const KEYS_REFETCH_INTERVAL_MS = 1000;
/** The longest request id kept from a caller, as the gateway keeps it. */
const REQUEST_ID_BYTES_MAX = 128;

const KEYS_PATH = "/.well-known/flashgate-keys.json";
const REVOKED_PATH = "/.well-known/flashgate-revoked.json";

/** GET answers that are the same for everyone, cached at the edge for their max-age. */
const PUBLIC_PATHS = [
  /^\/v1\/deals\/[^/]+$/,
  /^\/v1\/deals\/[^/]+\/queue$/,
  /^\/wait\/[^/]+$/,
  /^\/\.well-known\/flashgate-(keys|revoked)\.json$/,
];
const ORDER_PATH = /^\/v1\/deals\/([^/]+)\/orders$/;
const REQUEST_ID = /^[A-Za-z0-9._:-]+$/;

const PROBLEM_BASE = "https://flashgate.dev/problems/";

/** The gateway's own detail for each refusal the edge makes (PassError's messages). */
const PASS_REFUSALS = {
  forged: "the pass is malformed or its signature does not match",
  expired: "the pass has expired: join the waiting room again",
  other_deal: "the pass was issued for another deal",
  revoked: "the pass was revoked: its session on the line has ended",
};

/** Origin fetches under way per cache key: concurrent misses in one isolate share one. */
const inFlight = new Map();
/** Imported public keys by `kid:x`, so a key is imported once per isolate. */
const importedKeys = new Map();
/** When this isolate last fetched the key set past the cache for an unknown key id. */
let keysRefetchedAt = 0;
/** The last revocation feed parsed, by its body, so an unchanged feed is not parsed again. */
let revokedParsed = { text: null, ids: new Set() };

export default {
  async fetch(request, env, ctx) {
    const requestId = requestIdOf(request);
    let origin;
    try {
      origin = new URL(env.ORIGIN);
    } catch {
      return new Response("the Worker's ORIGIN binding is not a URL\n", { status: 500 });
    }
    const url = new URL(request.url);
    const target = new URL(url.pathname + url.search, origin);
    const method = request.method;
    if ((method === "GET" || method === "HEAD") && PUBLIC_PATHS.some((p) => p.test(url.pathname))) {
      const answer = await cachedPublic(target, ctx);
      return method === "HEAD" ? new Response(null, answer) : answer;
    }
    const order = method === "POST" ? ORDER_PATH.exec(url.pathname) : null;
    const deal = order ? decodedSegment(order[1]) : null;
    if (deal !== null && request.headers.has("flashgate-pass")) {
      const refusal = await judgePass(request.headers.get("flashgate-pass"), deal, origin, ctx);
      if (refusal) {
        const answer = problem(403, "waiting-room-required", "Waiting room pass required", PASS_REFUSALS[refusal], requestId);
        answer.headers.set("flashgate-edge", `refused ${refusal}`);
        return answer;
      }
    }
    return forward(request, target, requestId);
  },
};

// ------------------------------------------------------------------ forwarding

/**
 * The request to the origin with the client's address in `X-Forwarded-For` (what the
 * gateway's `server.client_ip_header` names by default; any value the client sent is
 * replaced, so a client cannot name itself) and the request id the edge answers with.
 */
async function forward(request, target, requestId) {
  const headers = new Headers(request.headers);
  const client = request.headers.get("cf-connecting-ip");
  if (client) {
    headers.set("x-forwarded-for", client);
  } else {
    headers.delete("x-forwarded-for");
  }
  headers.set("x-request-id", requestId);
  const init = { method: request.method, headers, redirect: "manual" };
  if (request.method !== "GET" && request.method !== "HEAD") {
    init.body = request.body;
  }
  return fetch(new Request(target, init));
}

function requestIdOf(request) {
  const given = request.headers.get("x-request-id");
  if (given && given.length <= REQUEST_ID_BYTES_MAX && REQUEST_ID.test(given)) {
    return given;
  }
  return `edge-${crypto.randomUUID()}`;
}

/** A problem+json answer shaped exactly as the gateway renders it (src/http/problem.rs). */
function problem(status, slug, title, detail, requestId) {
  const body =
    `{"type":"${PROBLEM_BASE}${slug}","title":"${title}","status":${status},` +
    `"detail":${JSON.stringify(detail)},"instance":"urn:flashgate:request:${requestId}"}`;
  return new Response(body, {
    status,
    headers: {
      "content-type": "application/problem+json",
      "cache-control": "no-store",
      "x-request-id": requestId,
    },
  });
}

// ------------------------------------------------------------------ the edge cache

/**
 * A public answer from the edge cache (the Workers Cache API, `caches.default`), fetched
 * from the origin on a miss and stored for the max-age the origin gave. The origin sees
 * about one fetch per key per max-age per cache; concurrent misses in one isolate share one
 * fetch. Only a 200 with `Cache-Control: public` is stored.
 */
async function cachedPublic(target, ctx, { fresh = false } = {}) {
  const key = new Request(target.toString(), { method: "GET" });
  if (!fresh) {
    const hit = await caches.default.match(key);
    if (hit) {
      return tagged(hit, "HIT");
    }
  }
  const name = `${fresh ? "fresh " : ""}${key.url}`;
  let pending = inFlight.get(name);
  if (!pending) {
    pending = fetchAndStore(key).finally(() => inFlight.delete(name));
    inFlight.set(name, pending);
  }
  const stored = await pending;
  return tagged(new Response(stored.body, stored), "MISS");
}

/** The origin's answer, read whole (public answers are small) and put in the cache. */
async function fetchAndStore(key) {
  const answer = await fetch(key);
  const body = await answer.arrayBuffer();
  const stored = { body, status: answer.status, statusText: answer.statusText, headers: new Headers(answer.headers) };
  const caching = stored.headers.get("cache-control") || "";
  if (answer.status === 200 && /\bpublic\b/.test(caching)) {
    await caches.default.put(key, new Response(body, stored));
  }
  return stored;
}

/** `answer` with `X-Edge-Cache` saying whether it came from the cache. */
function tagged(answer, status) {
  const copy = new Response(answer.body, answer);
  copy.headers.set("x-edge-cache", status);
  return copy;
}

async function cachedJson(origin, path, ctx, options) {
  const answer = await cachedPublic(new URL(path, origin), ctx, options);
  if (answer.status !== 200) {
    return null;
  }
  try {
    return await answer.json();
  } catch {
    return null;
  }
}

// ------------------------------------------------------------------ passes

/**
 * Why the edge refuses `raw` for an order on `deal` (a key of PASS_REFUSALS), or null when
 * the origin is to decide: the pass verified here, or the edge cannot judge it.
 */
async function judgePass(raw, deal, origin, ctx) {
  const line = await cachedJson(origin, `/v1/deals/${encodeURIComponent(deal)}/queue`, ctx);
  if (!line || line.state !== "open") {
    return null; // no line, or a sale not open: the origin's refusal comes first
  }
  const pass = trimAscii(raw);
  if (pass.length === 0) {
    return null; // missing: the origin says so, with the same words
  }
  if (pass.length > PASS_BYTES_MAX) {
    return "forged";
  }
  const parts = pass.split(".");
  if (parts.length === 2) {
    return null; // an HMAC pass: only holders of the secret can check it
  }
  if (parts.length !== 3) {
    return "forged";
  }
  const payload = await verifiedPayload(pass, parts, origin, ctx);
  if (!payload) {
    return "forged";
  }
  if (payload.d !== deal) {
    return "other_deal";
  }
  // The user binding (`u`) is the origin's to check: the edge cannot verify a user token.
  if (payload.e + EXPIRY_SKEW_SECONDS <= Math.floor(Date.now() / 1000)) {
    return "expired";
  }
  const revoked = await revokedIds(origin, ctx);
  return revoked.has(payload.p) ? "revoked" : null;
}

/** The payload of an Ed25519 pass whose signature verifies with a published key, else null. */
async function verifiedPayload(pass, [headerPart, payloadPart, signaturePart], origin, ctx) {
  const header = jsonOf(decodeBase64Url(headerPart));
  if (!header || typeof header.alg !== "string" || typeof header.kid !== "string") {
    return null;
  }
  if ("typ" in header && header.typ !== null && typeof header.typ !== "string") {
    return null;
  }
  if (header.alg !== "EdDSA" || utf8Length(header.kid) > KID_BYTES_MAX) {
    return null;
  }
  const key = await publishedKey(header.kid, origin, ctx);
  const signature = decodeBase64Url(signaturePart);
  if (!key || !signature || signature.length !== 64) {
    return null;
  }
  const signed = new TextEncoder().encode(pass.slice(0, headerPart.length + 1 + payloadPart.length));
  let good = false;
  try {
    good = await crypto.subtle.verify("Ed25519", key, signature, signed);
  } catch {
    return null;
  }
  if (!good) {
    return null;
  }
  const payload = jsonOf(decodeBase64Url(payloadPart));
  const fields = payload && typeof payload.d === "string" && typeof payload.u === "string" && typeof payload.p === "string";
  return fields && Number.isSafeInteger(payload.e) ? payload : null;
}

/**
 * The published key `kid`, imported for verification: from the cached key set, or, when
 * the cached set lacks it (a key rotated in since), from a fresh fetch of the set at most
 * once per KEYS_REFETCH_INTERVAL_MS.
 */
async function publishedKey(kid, origin, ctx) {
  let set = await cachedJson(origin, KEYS_PATH, ctx);
  let jwk = findKey(set, kid);
  const now = Date.now();
  if (!jwk && now - keysRefetchedAt >= KEYS_REFETCH_INTERVAL_MS) {
    keysRefetchedAt = now;
    set = await cachedJson(origin, KEYS_PATH, ctx, { fresh: true });
    jwk = findKey(set, kid);
  }
  if (!jwk || jwk.kty !== "OKP" || jwk.crv !== "Ed25519" || typeof jwk.x !== "string") {
    return null;
  }
  const name = `${kid}:${jwk.x}`;
  if (!importedKeys.has(name)) {
    const imported = crypto.subtle
      .importKey("jwk", { kty: "OKP", crv: "Ed25519", x: jwk.x }, { name: "Ed25519" }, false, ["verify"])
      .catch(() => null);
    importedKeys.set(name, imported);
  }
  return importedKeys.get(name);
}

function findKey(set, kid) {
  const keys = set && Array.isArray(set.keys) ? set.keys : [];
  return keys.find((k) => k && k.kid === kid) || null;
}

/** The pass ids of the revocation feed, as cached at the edge. */
async function revokedIds(origin, ctx) {
  const answer = await cachedPublic(new URL(REVOKED_PATH, origin), ctx);
  if (answer.status !== 200) {
    return new Set();
  }
  const text = await answer.text();
  if (text !== revokedParsed.text) {
    const feed = jsonOf(new TextEncoder().encode(text));
    const entries = feed && Array.isArray(feed.revoked) ? feed.revoked : [];
    revokedParsed = { text, ids: new Set(entries.map((e) => e && e.pass).filter((p) => typeof p === "string")) };
  }
  return revokedParsed.ids;
}

// ------------------------------------------------------------------ encodings

/** A path segment percent-decoded, or null when it does not decode (the origin answers it). */
function decodedSegment(segment) {
  try {
    return decodeURIComponent(segment);
  } catch {
    return null;
  }
}

/** `text` without leading and trailing ASCII whitespace, as Rust's trim_ascii. */
function trimAscii(text) {
  return text.replace(/^[\t\n\f\r ]+|[\t\n\f\r ]+$/g, "");
}

function utf8Length(text) {
  return new TextEncoder().encode(text).length;
}

/**
 * Bytes of unpadded base64url, or null, as strictly as the gateway's decoder: no padding,
 * no other alphabet, and no stray bits in the last character.
 */
function decodeBase64Url(text) {
  if (!/^[A-Za-z0-9_-]*$/.test(text) || text.length % 4 === 1) {
    return null;
  }
  const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  const bytes = new Uint8Array(Math.floor((text.length * 6) / 8));
  let buffer = 0;
  let bits = 0;
  let at = 0;
  for (const char of text) {
    buffer = (buffer << 6) | alphabet.indexOf(char);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes[at++] = (buffer >> bits) & 0xff;
      buffer &= (1 << bits) - 1;
    }
  }
  return (buffer & ((1 << bits) - 1)) === 0 ? bytes : null;
}

/** The JSON object in UTF-8 `bytes`, or null. */
function jsonOf(bytes) {
  if (!bytes) {
    return null;
  }
  try {
    const value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
    return value && typeof value === "object" && !Array.isArray(value) ? value : null;
  } catch {
    return null;
  }
}
