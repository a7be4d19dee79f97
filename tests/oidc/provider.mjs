// An OpenID Connect provider for the integration tests: oidc-provider (an OpenID Certified
// implementation) issuing RFC 9068 JWT access tokens for flashgate's audience through the
// client_credentials grant, where `sub` is the client id. Each `buyer-N` client is a
// buyer; the `operator` client's tokens carry `roles: ["flashgate-admin"]`, the `clerk`
// client's only `roles: ["clerk"]`. Every client's secret is `secret`.
//
// Usage: node provider.mjs --port <port|0> --key <file> [--algs PS256,ES256,EdDSA] [--generate-only]
//   --key           the provider's private signing key as a JWK; generated (RS256, with a
//                   fresh kid) and written there when the file does not exist, with the
//                   same key as PEM beside it (<file>.pem, private; <file>.pub.pem,
//                   public) for the tests that forge tokens. Restarting with another key
//                   file is a key rotation: the old kid leaves the JWKS.
//   --algs          more signing keys, one per algorithm (PS256, ES256, EdDSA), kept as
//                   <name>-<ALG>.json beside the key file (<name>.json) the same way; a
//                   token asked for the resource `urn:flashgate:<ALG>` is signed with that
//                   key (the default resource, `urn:flashgate`, with the RS256 key).
//   --generate-only write the key files and exit (keys the provider never publishes).
// It prints `listening <port>` once it serves. GET /test/jwks-fetches answers how many
// times the JWKS has been fetched since this process started.

import { generateKeyPairSync, randomUUID } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import Provider from 'oidc-provider';

const { values } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    key: { type: 'string' },
    algs: { type: 'string', default: '' },
    'generate-only': { type: 'boolean', default: false },
  },
});

/** How a key of each algorithm is generated. */
const KEY_TYPES = {
  RS256: ['rsa', { modulusLength: 2048 }],
  PS256: ['rsa', { modulusLength: 2048 }],
  ES256: ['ec', { namedCurve: 'P-256' }],
  EdDSA: ['ed25519', {}],
};

function signingKey(path, alg) {
  if (existsSync(path)) return JSON.parse(readFileSync(path, 'utf8'));
  const { privateKey, publicKey } = generateKeyPairSync(...KEY_TYPES[alg]);
  const jwk = { ...privateKey.export({ format: 'jwk' }), kid: randomUUID(), alg, use: 'sig' };
  writeFileSync(`${path}.pem`, privateKey.export({ format: 'pem', type: 'pkcs8' }));
  writeFileSync(`${path}.pub.pem`, publicKey.export({ format: 'pem', type: 'spki' }));
  writeFileSync(path, JSON.stringify(jwk));
  return jwk;
}

const algs = values.algs.split(',').filter((alg) => alg);
const keys = [
  signingKey(values.key, 'RS256'),
  ...algs.map((alg) => signingKey(values.key.replace(/\.json$/, `-${alg}.json`), alg)),
];
if (values['generate-only']) process.exit(0);

const AUDIENCE = 'flashgate';
const RESOURCE = 'urn:flashgate';
const clients = ['operator', 'clerk', ...Array.from({ length: 200 }, (_, i) => `buyer-${i}`)].map(
  (client_id) => ({
    client_id,
    client_secret: 'secret',
    grant_types: ['client_credentials'],
    redirect_uris: [],
    response_types: [],
  }),
);
const roles = { operator: ['flashgate-admin'], clerk: ['clerk'] };

async function start(port) {
  const server = (await import('node:http')).createServer();
  await new Promise((resolve) => server.listen(Number(port), '127.0.0.1', resolve));
  const bound = server.address().port;
  const provider = new Provider(`http://127.0.0.1:${bound}`, {
    clients,
    jwks: { keys },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => RESOURCE,
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx, resource) => ({
          scope: 'orders',
          audience: AUDIENCE,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: algs.find((alg) => resource === `${RESOURCE}:${alg}`) || 'RS256' } },
        }),
      },
    },
    ttl: { ClientCredentials: 600 },
    extraTokenClaims: (_ctx, token) => (roles[token.clientId] ? { roles: roles[token.clientId] } : undefined),
  });
  let jwksFetches = 0;
  provider.use(async (ctx, next) => {
    if (ctx.path === '/test/jwks-fetches') {
      ctx.body = { fetches: jwksFetches };
      return;
    }
    if (ctx.path === '/jwks') jwksFetches += 1;
    await next();
  });
  server.on('request', provider.callback());
  console.log(`listening ${bound}`);
}

await start(values.port);
