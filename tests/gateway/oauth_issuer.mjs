// A real OAuth 2.1 / OIDC issuer for the tests: oauth2-mock-server (npm) signs RS256 JWT
// access tokens with a key it makes at start and publishes at its jwks_uri. Two
// additions on top of its defaults, as a real authorization server behaves:
// - RFC 8707: the `resource` of a token request becomes the token's `aud`;
// - a client-credentials token names its client in `sub`;
// - an authorization code carries the scope (and resource) its authorization request asked
//   for into its token (the mock otherwise grants "dummy").
// Usage: node issuer.mjs <path of oauth2-mock-server's dist/index.mjs> <port>
// Prints "ready <issuer URL>" once it listens on 127.0.0.1.
import { pathToFileURL } from "node:url";

const [, , modulePath, port] = process.argv;
const { OAuth2Server } = await import(pathToFileURL(modulePath).href);
const server = new OAuth2Server();
await server.issuer.keys.generate("RS256");
const codes = new Map();  // authorization code -> {scope, resource}
server.service.on("beforeAuthorizeRedirect", (redirect, req) => {
  const query = new URL(req.url, "http://issuer").searchParams;
  codes.set(redirect.url.searchParams.get("code"),
            { scope: query.get("scope") || "", resource: query.get("resource") });
});
server.service.on("beforeTokenSigning", (token, req) => {
  const body = req.body || {};
  const granted = body.code ? codes.get(body.code) : undefined;
  if (granted) {
    token.payload.scope = granted.scope;
    if (granted.resource) token.payload.aud = granted.resource;
  }
  if (body.resource) token.payload.aud = body.resource;
  if (!token.payload.sub) {
    let client = body.client_id;
    const auth = req.headers.authorization || "";
    if (!client && auth.startsWith("Basic ")) {
      client = Buffer.from(auth.slice(6), "base64").toString().split(":")[0];
    }
    if (client) token.payload.sub = decodeURIComponent(client);
  }
  if (body.expires_in) token.payload.exp = token.payload.iat + Number(body.expires_in);
});
server.service.on("beforeResponse", (response, req) => {
  const granted = req.body && req.body.code ? codes.get(req.body.code) : undefined;
  if (granted && response.body.access_token) response.body.scope = granted.scope;
});
await server.start(Number(port), "127.0.0.1");
console.log(`ready ${server.issuer.url}`);
process.on("SIGTERM", async () => { await server.stop(); process.exit(0); });
