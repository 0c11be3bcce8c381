// The official TypeScript MCP SDK (npm @modelcontextprotocol/sdk, pinned in the Makefile) as a
// client of the gateway. Usage:
//   node ts_client.mjs PACKAGE_DIR URL API_KEY TRACEPARENT CALLS_JSON
// CALLS_JSON is a list of [tool, arguments]. The client connects with the SDK's
// StreamableHTTPClientTransport (API key in the Authorization header), lists the tools, makes
// each call in order, and prints one JSON object on stdout:
//   {"protocolVersion", "sessionId", "tools": [names], "calls": [{"tool", "ok", "result" |
//    "error": {"name", "code", "message"}}]}
// A call that fails is reported, not thrown, so that one run shows allowed and refused calls.
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [packageDir, url, apiKey, traceparent, callsJson] = process.argv.slice(2);
// The package is installed outside this tree (.cache/npm/mcp-sdk, see the Makefile).
const sdk = join(packageDir, "node_modules", "@modelcontextprotocol", "sdk", "dist", "esm");
const { Client } = await import(pathToFileURL(join(sdk, "client", "index.js")).href);
const { StreamableHTTPClientTransport } = await import(
  pathToFileURL(join(sdk, "client", "streamableHttp.js")).href);

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${apiKey}`, traceparent } },
});
const client = new Client({ name: "sg-ts-test-client", version: "1.0.0" });
await client.connect(transport);

const out = {
  protocolVersion: transport.protocolVersion ?? null,
  sessionId: transport.sessionId ?? null,
  tools: (await client.listTools()).tools.map((t) => t.name),
  calls: [],
};
for (const [tool, args] of JSON.parse(callsJson)) {
  try {
    const result = await client.callTool({ name: tool, arguments: args });
    out.calls.push({ tool, ok: true, result });
  } catch (err) {
    out.calls.push({
      tool, ok: false,
      error: { name: err?.constructor?.name ?? "Error", code: err?.code ?? null,
               message: String(err?.message ?? err) },
    });
  }
}
await transport.terminateSession();
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
