// The buyer's provider token, checked at the edge: a pass names its user (`u`), and when
// the buyer's bearer token is an OpenID Connect provider's (RS256, PS256, ES256 or EdDSA,
// not the gateway's shared-secret HS256), its signature can be checked here against the
// provider's published keys, so a pass presented with another user's token is refused
// without the origin.
//
// The gateway publishes what the edge needs in its key document (`provider`: issuer,
// jwks_url, audience, user_claim, user_id_bytes_max, token_bytes_max). The edge only ever refuses a token it
// verified completely, with checks at least as strict as the gateway's (no clock leeway);
// anything it cannot verify goes to the origin, which decides.

/** A JWKS is kept this long when the provider says nothing (Cache-Control max-age wins). */
const JWKS_MAX_AGE_DEFAULT_SECONDS = 300;
/** A token naming a key the held JWKS lacks fetches it again at most once per this. */
const JWKS_REFETCH_INTERVAL_MS = 1000;
/** Longest bearer token looked at; longer ones go to the origin. */
const TOKEN_BYTES_MAX = 8192;

/** How each algorithm imports its key and verifies with it. */
const ALGORITHMS = {
  RS256: { kty: "RSA", importAs: { name: "RSASSA-PKCS1-v1_5", hash: "SHA-256" }, verifyAs: { name: "RSASSA-PKCS1-v1_5" } },
  PS256: { kty: "RSA", importAs: { name: "RSA-PSS", hash: "SHA-256" }, verifyAs: { name: "RSA-PSS", saltLength: 32 } },
  ES256: { kty: "EC", crv: "P-256", importAs: { name: "ECDSA", namedCurve: "P-256" }, verifyAs: { name: "ECDSA", hash: "SHA-256" } },
  EdDSA: { kty: "OKP", crv: "Ed25519", importAs: { name: "Ed25519" }, verifyAs: { name: "Ed25519" } },
};

/** JWKS by URL: { keys, until, fetchedAt }. */
const jwksHeld = new Map();
/** Imported keys by URL, kid and algorithm. */
const imported = new Map();

/**
 * The user a verified provider token names, or null when the edge cannot say (no token, a
 * shared-secret token, no provider published, a key or claim it cannot check).
 */
export async function providerUser(authorization, provider, helpers) {
  if (!provider || typeof provider !== "object" || typeof authorization !== "string") {
    return null;
  }
  const token = /^Bearer ([A-Za-z0-9_.-]+)$/.exec(authorization.trim());
  const limit = Number.isSafeInteger(provider.token_bytes_max) ? provider.token_bytes_max : 0;
  if (!token || token[1].length > Math.min(limit, TOKEN_BYTES_MAX)) {
    return null;
  }
  const parts = token[1].split(".");
  if (parts.length !== 3) {
    return null;
  }
  const header = helpers.jsonOf(helpers.decodeBase64Url(parts[0]));
  const algorithm = header && ALGORITHMS[header.alg];
  if (!algorithm || typeof header.kid !== "string") {
    return null;
  }
  const key = await providerKey(provider, header.kid, header.alg, algorithm);
  const signature = helpers.decodeBase64Url(parts[2]);
  if (!key || !signature) {
    return null;
  }
  const signed = new TextEncoder().encode(`${parts[0]}.${parts[1]}`);
  let good = false;
  try {
    good = await crypto.subtle.verify(algorithm.verifyAs, key, signature, signed);
  } catch {
    return null;
  }
  const claims = good ? helpers.jsonOf(helpers.decodeBase64Url(parts[1])) : null;
  return claims ? userOf(claims, provider) : null;
}

/** The user of verified `claims`, when every claim the gateway checks holds strictly. */
function userOf(claims, provider) {
  const now = Math.floor(Date.now() / 1000);
  if (!Number.isSafeInteger(claims.exp) || claims.exp < now) {
    return null;
  }
  if ("nbf" in claims && !(Number.isSafeInteger(claims.nbf) && claims.nbf <= now)) {
    return null;
  }
  if (provider.issuer && claims.iss !== provider.issuer) {
    return null;
  }
  const audiences = Array.isArray(claims.aud) ? claims.aud : [claims.aud];
  if (typeof provider.audience !== "string" || !audiences.includes(provider.audience)) {
    return null;
  }
  const user = claims[provider.user_claim];
  const bytes = typeof user === "string" ? new TextEncoder().encode(user).length : 0;
  const limit = Number.isSafeInteger(provider.user_id_bytes_max) ? provider.user_id_bytes_max : 0;
  return bytes >= 1 && bytes <= limit && !/[\u0000-\u001f\u007f]/.test(user) ? user : null;
}

/** The provider's key `kid` for `alg`, imported, or null. */
async function providerKey(provider, kid, alg, algorithm) {
  const url = await jwksUrl(provider);
  if (!url) {
    return null;
  }
  let jwk = findKey(await jwks(url, false), kid);
  if (!jwk) {
    jwk = findKey(await jwks(url, true), kid);
  }
  if (!jwk || jwk.kty !== algorithm.kty || (algorithm.crv && jwk.crv !== algorithm.crv)) {
    return null;
  }
  if ("use" in jwk && jwk.use !== "sig") {
    return null;
  }
  // As the gateway reads a key: its own `alg`, or, without one, RS256 for RSA and the
  // curve's algorithm otherwise; a token may use no other.
  if (jwk.alg !== alg && !(jwk.alg === undefined && (algorithm.crv || alg === "RS256"))) {
    return null;
  }
  const name = `${url} ${kid} ${alg}`;
  if (!imported.has(name)) {
    const { kty, n, e, crv, x, y } = jwk;
    const publicPart = Object.fromEntries(Object.entries({ kty, n, e, crv, x, y }).filter(([, v]) => v !== undefined));
    imported.set(name, crypto.subtle.importKey("jwk", publicPart, algorithm.importAs, false, ["verify"]).catch(() => null));
  }
  return imported.get(name);
}

/** The JWKS URL: published, or found through the issuer's discovery document. */
async function jwksUrl(provider) {
  if (typeof provider.jwks_url === "string" && provider.jwks_url) {
    return provider.jwks_url;
  }
  if (typeof provider.issuer !== "string" || !provider.issuer) {
    return null;
  }
  const discovery = await jsonFetched(`${provider.issuer.replace(/\/$/, "")}/.well-known/openid-configuration`);
  return discovery && typeof discovery.body.jwks_uri === "string" ? discovery.body.jwks_uri : null;
}

/** The keys at `url`, held for their max-age; `again` refetches (at most once a second). */
async function jwks(url, again) {
  const held = jwksHeld.get(url);
  const now = Date.now();
  if (held && !again && now < held.until) {
    return held.keys;
  }
  if (held && now - held.fetchedAt < JWKS_REFETCH_INTERVAL_MS) {
    return held.keys;
  }
  const fetched = await jsonFetched(url);
  const keys = fetched && Array.isArray(fetched.body.keys) ? fetched.body.keys : held ? held.keys : [];
  const maxAge = fetched && fetched.maxAge !== null ? fetched.maxAge : JWKS_MAX_AGE_DEFAULT_SECONDS;
  jwksHeld.set(url, { keys, until: now + 1000 * maxAge, fetchedAt: now });
  return keys;
}

function findKey(keys, kid) {
  return keys.find((k) => k && typeof k === "object" && k.kid === kid) || null;
}

/** A JSON object fetched from `url` with its Cache-Control max-age, or null. */
async function jsonFetched(url) {
  try {
    const answer = await fetch(url);
    if (answer.status !== 200) {
      return null;
    }
    const body = await answer.json();
    const maxAge = /max-age=(\d+)/.exec(answer.headers.get("cache-control") || "");
    return body && typeof body === "object" ? { body, maxAge: maxAge ? Number(maxAge[1]) : null } : null;
  } catch {
    return null;
  }
}
