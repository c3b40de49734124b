/**
 * The shapes of waffle's console API (issue 27's contract), as the page
 * reads them.
 *
 * @module
 */

/** Who the key is. */
export interface WhoAmI {
  tenant: string;
  keyId: string;
  keyName: string;
  admin: boolean;
  backend: "docker" | "kubernetes";
  features: { metrics: boolean; snapshots: boolean; fork: boolean; stop: boolean };
}

/** One sandbox of `GET /waffle/v1/sandboxes`. */
export interface ConsoleSandbox {
  sandboxID: string;
  tenant: string;
  templateID: string;
  image: string;
  state: "running" | "paused" | "stopped";
  startedAt: string;
  endAt: string;
  metadata: Record<string, string>;
  cpuCount: number | null;
  cpuUsedPct: number | null;
  memUsed: number | null;
  memTotal: number | null;
  diskUsed: number | null;
  diskTotal: number | null;
  pool: string | null;
  egress: { attached: boolean; allow: string[] };
  lastCommand:
    | { argv: string[]; startedAt: string; exitCode: number | null; running: boolean }
    | null;
}

/** One command of `GET /waffle/v1/sandboxes/{id}/commands`. */
export interface ConsoleCommand {
  id: string;
  pid: number | null;
  argv: string[];
  cwd: string | null;
  startedAt: string;
  endedAt: string | null;
  durationMs: number | null;
  exitCode: number | null;
  signal: number | null;
  running: boolean;
  stdoutTail: string;
  stderrTail: string;
  truncated: boolean;
}

/** One egress decision. */
export interface EgressEntry {
  time: string;
  tenant: string;
  sandbox: string;
  method: string;
  destination: string | null;
  port: number | null;
  address: string | null;
  decision: string;
  reason: string | null;
  bytesUp: number;
  bytesDown: number;
  durationMs: number;
  count: number;
}

/** `GET /waffle/v1/egress`. */
export interface EgressAnswer {
  entries: EgressEntry[];
  destinations: {
    destination: string | null;
    port: number | null;
    allowed: number;
    denied: number;
  }[];
  series: { minute: string; allowed: number; denied: number }[];
}

/** One MCP call. */
export interface McpEntry {
  time: string;
  tenant: string;
  sandbox: string;
  server: string;
  from: string;
  method: string;
  tool: string | null;
  arguments: string[];
  durationMs: number;
  outcome: string;
  count: number;
}

/** `GET /waffle/v1/mcp`. */
export interface McpAnswer {
  entries: McpEntry[];
  servers: { server: string; ok: number; failed: number }[];
  series: { minute: string; ok: number; failed: number }[];
}

/** One E2B metrics sample. */
export interface MetricSample {
  timestampUnix: number;
  cpuUsedPct: number;
  memUsed: number;
  memTotal: number;
  diskUsed: number;
  diskTotal: number;
}
