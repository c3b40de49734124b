/**
 * `waffle egress-proxy`: the egress proxy process (what runs in the proxy's
 * container; waffle starts it, users never need to).
 *
 * @module
 */
import { runProxy } from "../egress/proxy.ts";
import { egressLog } from "../egress/log.ts";
import { UsageError } from "../errors.ts";
import { parse, stringFlag } from "./args.ts";

/** Help text of `waffle egress-proxy`. */
export const EGRESS_PROXY_HELP = `Usage: waffle egress-proxy --dir DIR --audit FILE

Serves the egress proxy of one waffle home: a socket per sandbox under
DIR/sockets, each sandbox's policy read from DIR/policies, the CA from
DIR/ca, one audit line per connection appended to FILE. waffle starts it in
a container of its own when a sandbox with an egress list needs it.
`;

/**
 * Runs `waffle egress-proxy` until SIGTERM or SIGINT.
 *
 * @param args Arguments after `egress-proxy`.
 * @returns The exit status.
 */
export async function egressProxyCommand(args: string[]): Promise<number> {
  const parsed = parse(args, { dir: { type: "string" }, audit: { type: "string" } });
  if (parsed.positionals.length > 0) {
    throw new UsageError(`Unexpected argument '${parsed.positionals[0]}'`);
  }
  const dir = stringFlag(parsed, "dir");
  const audit = stringFlag(parsed, "audit");
  if (dir === undefined) throw new UsageError("Missing --dir DIR");
  if (audit === undefined) throw new UsageError("Missing --audit FILE");
  // One identity's connection hitting a bug must not end every identity's
  // egress: what escapes a connection's handlers is logged, not fatal.
  globalThis.addEventListener("error", (event) => {
    event.preventDefault();
    egressLog(`Uncaught: ${event.message}`);
  });
  globalThis.addEventListener("unhandledrejection", (event) => {
    event.preventDefault();
    egressLog(`Unhandled rejection: ${String(event.reason)}`);
  });
  const stop = new AbortController();
  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    Deno.addSignalListener(signal, () => stop.abort());
  }
  await runProxy({ dir, audit, signal: stop.signal });
  return 0;
}
