// A real OpenID provider on loopback for the identity tests: panva's oidc-provider (npm,
// pinned in the Makefile), client-credentials grant issuing RFC 9068 JWT access tokens for the
// resource "urn:sovereign-gateway" (by default) or the resource the client names. Usage: node oidc_provider.mjs PORT PRIVATE_JWKS_FILE
// The private JWKS (keys in signing order: the first RS256 key signs) is written by the test,
// so that it can rotate the provider's signing key by restarting it with another file.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [port, jwksFile, packageDir] = process.argv.slice(2);
// The package is installed outside this tree (.cache/npm/oidc-provider, see the Makefile).
const entry = join(packageDir, "node_modules", "oidc-provider", "lib", "index.js");
const { default: Provider } = await import(pathToFileURL(entry).href);
const issuer = `http://127.0.0.1:${port}`;
const jwks = JSON.parse(readFileSync(jwksFile, "utf8"));
const audience = "urn:sovereign-gateway";

const provider = new Provider(issuer, {
  jwks,
  clients: [
    {
      client_id: "ci-bot",
      client_secret: "ci-bot-secret-of-the-test",
      grant_types: ["client_credentials"],
      redirect_uris: [],
      response_types: [],
    },
    {
      // A web application signing people in (authorization code + PKCE, the dev login form).
      client_id: "webapp",
      client_secret: "webapp-secret-of-the-test",
      grant_types: ["authorization_code"],
      redirect_uris: ["http://127.0.0.1:9/callback"],
      response_types: ["code"],
    },
    {
      client_id: "intruder",
      client_secret: "intruder-secret-of-the-test",
      grant_types: ["client_credentials"],
      redirect_uris: [],
      response_types: [],
    },
  ],
  features: {
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => audience,
      useGrantedResource: () => true,
      // Any resource a client names (RFC 8707) is a resource server whose tokens carry it as
      // their audience: the gateway's MCP endpoints (https://gw/mcp/<name>) are resources of
      // their own beside the chat API's "urn:sovereign-gateway".
      getResourceServerInfo: (ctx, resourceIndicator) => ({
        scope: "chat mcp:tools mcp:admin",
        audience: resourceIndicator,
        accessTokenFormat: "jwt",
        accessTokenTTL: 300,
        jwt: { sign: { alg: "RS256" } },
      }),
    },
  },
  // The claims the gateway's identity rules map: groups by client, or by person for tokens
  // issued after a login (accountId is the login name typed into the dev form).
  extraTokenClaims: async (ctx, token) => {
    if (token.accountId) {
      return { groups: token.accountId === "alice" ? ["ml-engineers"] : ["visitors"] };
    }
    return { groups: token.clientId === "ci-bot" ? ["ml-engineers"] : ["visitors"] };
  },
  cookies: { keys: ["cookie-key-of-the-test-only"] },
});
// Errors go to the output the test shows when the provider fails.
provider.on("server_error", (ctx, err) => process.stdout.write(`server_error: ${err.stack}\n`));
provider.listen(Number(port), "127.0.0.1", () => {
  process.stdout.write(`listening ${issuer}\n`);
});
