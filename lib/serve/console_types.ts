/**
 * The wire shapes of `/waffle/v1` (the console's API) and of the metrics it
 * charts: one copy, read by the server that writes them and by the page in
 * `ui/` that reads them. Types only, importing nothing, so the page (checked
 * with the DOM's lib) takes none of the server's code with them.
 *
 * @module
 */

/** Who a key is (`GET /waffle/v1/whoami`), and what the server can do for it. */
export interface WhoAmI {
  /** The key's tenant. */
  tenant: string;
  /** The key's id. */
  keyId: string;
  /** The key's name. */
  keyName: string;
  /** An admin key sees every tenant's sandboxes. */
  admin: boolean;
  /** Where sandboxes run. */
  backend: "docker" | "kubernetes";
  /** What this server offers (Docker-only features are off on Kubernetes). */
  features: { metrics: boolean; snapshots: boolean; fork: boolean; stop: boolean };
}

/** One row of the console's sandboxes table (`GET /waffle/v1/sandboxes`). */
export interface ConsoleSandbox {
  /** Its id. */
  sandboxID: string;
  /** Its tenant. */
  tenant: string;
  /** Its template. */
  templateID: string;
  /** The image it runs. */
  image: string;
  /** Running, paused, or stopped (its container is not running). */
  state: "running" | "paused" | "stopped";
  /** When made, ISO. */
  startedAt: string;
  /** When the reaper removes it, ISO. */
  endAt: string;
  /** The caller's metadata. */
  metadata: Record<string, string>;
  /** From its newest sample, each null when it has none. */
  cpuCount: number | null;
  /** CPU in percent of `cpuCount`. */
  cpuUsedPct: number | null;
  /** Memory charged, bytes. */
  memUsed: number | null;
  /** Memory limit, bytes. */
  memTotal: number | null;
  /** Bytes used on its volume. */
  diskUsed: number | null;
  /** Its volume's size, bytes. */
  diskTotal: number | null;
  /** The warm pool's template it was taken from; null when none or unknown. */
  pool: string | null;
  /** Attached to the egress proxy, and what it may reach (`*`: anything). */
  egress: { attached: boolean; allow: string[] };
  /** Its newest command. */
  lastCommand:
    | { argv: string[]; startedAt: string; exitCode: number | null; running: boolean }
    | null;
}

/** One command as the console lists it (`GET /waffle/v1/sandboxes/{id}/commands`). */
export interface ConsoleCommand {
  /** The waffle request id of its process. */
  id: string;
  /** Its envd pid while it runs (for `process.Connect`), else null. */
  pid: number | null;
  /** Program and arguments, as started, capped (1 KiB a word, 8 KiB in all). */
  argv: string[];
  /** Its argv was cut (a word or the whole too long). */
  argvTruncated?: true;
  /** Its working directory as asked, or null for the home. */
  cwd: string | null;
  /** When it started (or was taken over), ISO. */
  startedAt: string;
  /** When it ended, ISO; null while it runs. */
  endedAt: string | null;
  /** Start to end, in ms; null while it runs. */
  durationMs: number | null;
  /** Its exit code; null while it runs or when it died of a signal or never ran. */
  exitCode: number | null;
  /** The signal that ended it (its number), else null. */
  signal: number | null;
  /** It runs now. */
  running: boolean;
  /** The last 4 KiB of its stdout (a terminal's output too), lossy UTF-8. */
  stdoutTail: string;
  /** The last 4 KiB of its stderr, lossy UTF-8. */
  stderrTail: string;
  /** A tail lost its beginning. */
  truncated: boolean;
}

/** One egress entry of the console. */
export interface EgressEntry {
  /** When it was accepted (ISO). */
  time: string;
  /** Its identity's tenant. */
  tenant: string;
  /** Its identity's user: the sandbox id. */
  sandbox: string;
  /** `CONNECT` or the request's method. */
  method: string | null;
  /** The host asked for. */
  destination: string | null;
  /** The port asked for. */
  port: number | null;
  /** The address connected to. */
  address: string | null;
  /** Allowed or denied. */
  decision: "allowed" | "denied";
  /** Why denied, or how an allowed one ended badly. */
  reason: string | null;
  /** Bytes up. */
  bytesUp: number;
  /** Bytes down. */
  bytesDown: number;
  /** Accept to close. */
  durationMs: number;
  /** Connections the line stands for. */
  count: number;
}

/** The answer of `GET /waffle/v1/egress`. */
export interface EgressView {
  /** Newest first. */
  entries: EgressEntry[];
  /** Per destination and port, most first. */
  destinations: {
    destination: string | null;
    port: number | null;
    allowed: number;
    denied: number;
  }[];
  /** The last 60 minutes, oldest first. */
  series: { minute: string; allowed: number; denied: number }[];
}

/** One MCP entry of the console. */
export interface McpEntry {
  /** When the request was received (ISO). */
  time: string;
  /** The tenant. */
  tenant: string;
  /** The record's user: the sandbox id (null for a host server). */
  sandbox: string | null;
  /** The MCP server. */
  server: string;
  /** Who sent the request. */
  from: "client" | "server";
  /** The method. */
  method: string;
  /** The tool called. */
  tool: string | null;
  /** The arguments' names. */
  arguments: string[];
  /** Request to response. */
  durationMs: number;
  /** How it ended. */
  outcome: string;
  /** Requests the line stands for. */
  count: number;
}

/** The answer of `GET /waffle/v1/mcp`. */
export interface McpView {
  /** Newest first. */
  entries: McpEntry[];
  /** Per server, most first. */
  servers: { server: string; ok: number; failed: number }[];
  /** The last 60 minutes, oldest first. */
  series: { minute: string; ok: number; failed: number }[];
}

/** One sample as E2B's API names its fields (`SandboxMetric`). */
export interface SandboxMetric {
  /** When it was taken (ISO 8601). */
  timestamp: string;
  /** When it was taken, in whole seconds since the epoch. */
  timestampUnix: number;
  /** CPUs the sandbox may use. */
  cpuCount: number;
  /** CPU used since the sample before, in percent of `cpuCount` CPUs. */
  cpuUsedPct: number;
  /** Memory charged to the sandbox, in bytes. */
  memUsed: number;
  /** Its memory limit, in bytes. */
  memTotal: number;
  /** Bytes used on its volume. */
  diskUsed: number;
  /** Its volume's size (its quota), in bytes. */
  diskTotal: number;
}
