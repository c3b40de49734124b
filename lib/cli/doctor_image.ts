/**
 * What the configured image provides, as `waffle doctor` shows it: looked
 * at from inside a sandbox by waffle's own Deno (so an image without a shell
 * can be looked at too), as the commands' uid and with their PATH.
 *
 * @module
 */
import * as z from "../schema.ts";
import { SANDBOX_DENO_ARGV, SANDBOX_DENO_ENV } from "../lifecycle/posture.ts";
import type { Sandbox } from "../sandbox/open.ts";

/** The tools `doctor` looks for on the commands' PATH. */
const TOOLS = ["sh", "bash", "python3", "pip3", "git", "curl", "node", "tar"] as const;

// Runs inside the sandbox: the loader names the libc, PATH the tools.
const PROBE = `
const exists = (p) => { try { Deno.statSync(p); return true; } catch { return false; } };
const names = (d) => { try { return [...Deno.readDirSync(d)].map((e) => e.name); } catch { return []; } };
const dirs = ["/lib", "/lib64", "/usr/lib", "/usr/lib64"];
const loaders = dirs.flatMap((d) => names(d).map((n) => d + "/" + n));
const libc = loaders.some((p) => /ld-linux[^/]*\\.so/.test(p)) ? "glibc"
  : loaders.some((p) => /ld-musl-[^/]*\\.so/.test(p)) ? "musl" : "none";
// Deno puts a node shim directory of its own cache first: not the image's.
const path = (Deno.env.get("PATH") ?? "").split(":")
  .filter((d) => d.startsWith("/") && !d.startsWith(${JSON.stringify(SANDBOX_DENO_ENV.DENO_DIR)}));
const tools = Object.fromEntries(${
  JSON.stringify(TOOLS)
}.map((t) => [t, path.some((d) => exists(d + "/" + t))]));
console.log(JSON.stringify({ libc, tools, passwd: exists("/etc/passwd") }));
`;

const probeSchema = z.object({
  libc: z.enum(["glibc", "musl", "none"]),
  tools: z.record(z.string(), z.boolean()),
  passwd: z.boolean(),
});

/**
 * Looks inside a running sandbox at what its image provides.
 *
 * @param sandbox A sandbox whose runner serves (ensured).
 * @returns One line: the libc, the tools found and missing, the user table.
 * @throws {Error} When the probe fails or answers out of shape.
 */
export async function describeImage(sandbox: Sandbox): Promise<string> {
  const id = await sandbox.submit({
    argv: [...SANDBOX_DENO_ARGV, "eval", "--quiet", PROBE],
    env: { ...SANDBOX_DENO_ENV },
    outputCap: 4096,
  });
  const { result, stdout } = await sandbox.queue.collect(id);
  await sandbox.queue.ack(id);
  const text = new TextDecoder().decode(stdout).trim();
  const parsed = result.exitCode === 0 ? probeSchema.safeParse(safeJson(text)) : undefined;
  if (parsed?.success !== true) {
    throw new Error(`Image probe failed: exit ${result.exitCode}, '${text.slice(0, 80)}'`);
  }
  const found = TOOLS.filter((tool) => parsed.data.tools[tool]);
  const missing = TOOLS.filter((tool) => !parsed.data.tools[tool]);
  return [
    `libc ${parsed.data.libc} (waffle brings its own)`,
    `has ${found.join(" ") || "none of " + TOOLS.join(" ")}`,
    ...(missing.length > 0 && found.length > 0 ? [`lacks ${missing.join(" ")}`] : []),
    parsed.data.passwd ? "has /etc/passwd" : "no /etc/passwd (commands run as uid 10001 anyway)",
  ].join(", ");
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
