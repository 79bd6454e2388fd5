// node-oidc-provider as the benchmark's peer (bench/peer.py installs the pinned version from the
// npm registry into a temporary directory and runs this file there):
//
//     node oidc-provider.mjs PORT OUTDIR TOKENS
//
// One confidential client (client_secret_basic), introspection on, opaque access tokens, each
// of its own grant for one account (as tokensvc's introspection re-checks the token's grant).
// Tokens are kept in a plain Map: the library's own memory adapter is an LRU of 1,000 entries,
// which would forget most of them and answer {"active":false} without looking. The tokens go
// to OUTDIR/access.txt, one per line, then OUTDIR/ready is written. Nothing is logged per
// request: the library writes no access line.
import { generateKeyPairSync } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

import Provider from 'oidc-provider';

const [port, out, count] = [Number(process.argv[2]), process.argv[3], Number(process.argv[4] || 10000)];
const CLIENT_ID = 'bench';
const CLIENT_SECRET = 'bench-client-secret-0123456789abcdef';
const DAY = 86400;

// A signing key of its own (the library warns about its development keys); introspection
// signs nothing.
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const jwks = { keys: [{ ...privateKey.export({ format: 'jwk' }), kid: 'bench', use: 'sig', alg: 'RS256' }] };

const stores = new Map();

class MapAdapter {
  constructor(name) {
    if (!stores.has(name)) stores.set(name, new Map());
    this.store = stores.get(name);
  }

  async upsert(id, payload) { this.store.set(id, payload); }

  async find(id) { return this.store.get(id); }

  async findByUid(uid) { return [...this.store.values()].find((payload) => payload.uid === uid); }

  async findByUserCode(userCode) { return [...this.store.values()].find((payload) => payload.userCode === userCode); }

  async consume(id) { const payload = this.store.get(id); if (payload) payload.consumed = Math.floor(Date.now() / 1000); }

  async destroy(id) { this.store.delete(id); }

  async revokeByGrantId(grantId) {
    for (const [id, payload] of this.store) if (payload.grantId === grantId) this.store.delete(id);
  }
}

const provider = new Provider(`http://127.0.0.1:${port}`, {
  adapter: MapAdapter,
  clients: [{
    client_id: CLIENT_ID,
    client_secret: CLIENT_SECRET,
    token_endpoint_auth_method: 'client_secret_basic',
    redirect_uris: ['https://127.0.0.1/cb'],
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
  }],
  cookies: { keys: ['bench-cookie-key-0123456789'] },
  jwks,
  features: {
    // Who may introspect: a confidential client (tokensvc's rule; the library's default
    // policy, the same, asks to be replaced).
    introspection: { enabled: true, allowedPolicy: async (ctx, caller) => caller.clientAuthMethod !== 'none' },
    devInteractions: { enabled: false },
  },
  findAccount: async (ctx, sub) => ({ accountId: sub, claims: async () => ({ sub }) }),
  ttl: { AccessToken: DAY, Grant: DAY },
});
provider.on('server_error', (ctx, error) => console.error('server_error', error));

const client = await provider.Client.find(CLIENT_ID);
const tokens = [];
for (let i = 0; i < count; i += 1) {
  const grant = new provider.Grant({ accountId: 'bench-user', clientId: CLIENT_ID });
  grant.addOIDCScope('openid');
  const grantId = await grant.save();
  const token = new provider.AccessToken({ accountId: 'bench-user', client, grantId, scope: 'openid' });
  tokens.push(await token.save());
}
writeFileSync(join(out, 'access.txt'), `${tokens.join('\n')}\n`);
provider.listen(port, '127.0.0.1', () => writeFileSync(join(out, 'ready'), 'ok'));
