/**
 * What every envd service of one sandbox shares: its context, and the rule
 * that no call runs as root.
 *
 * @module
 */
import { Code, ConnectError, type HandlerContext, type Interceptor } from "@connectrpc/connect";
import type { FilesTarget, SandboxFiles } from "../files/mod.ts";
import type { SandboxProcesses } from "../lifecycle/run.ts";
import type { ProcessTable } from "./processes.ts";
import type { SandboxRecord } from "./state.ts";

/**
 * What envd uses of a sandbox: its processes, its files and how a command
 * inside runs waffle. A sandbox of this host (`openSandbox`) is one; so is
 * the sandbox `waffle agent` holds in a pod (`lib/k8s/pod_sandbox.ts`).
 */
export type EnvdSandbox = FilesTarget & SandboxProcesses & { readonly files: SandboxFiles };

/** What the services of one sandbox need. */
export interface EnvdContext {
  /** The sandbox's processes. */
  table: ProcessTable;
  /** The sandbox's record (its variables). */
  record: SandboxRecord;
  /** Aborted when the sandbox is killed: its streams end. */
  killed: AbortSignal;
  /** Largest request body. */
  maxBodyBytes: number;
  /** The open waffle sandbox (the filesystem service runs its commands). */
  sandbox: EnvdSandbox;
  /** Run around every call (the server's stream limit). */
  interceptors?: Interceptor[];
  /** Why the sandbox takes no call now (it is paused), read afresh on each call; else undefined. */
  paused?: () => string | undefined;
}

/**
 * Refuses a call made as `root` (`permission_denied`). The user comes from
 * the Basic-auth name; every user runs as the sandbox's unprivileged uid,
 * and root is refused rather than quietly run as another.
 *
 * @param handler The call.
 */
export function refuseRoot(handler: HandlerContext): void {
  const header = handler.requestHeader.get("authorization") ?? "";
  const match = /^Basic\s+(\S+)$/i.exec(header);
  if (match === null) return;
  let user = "";
  try {
    user = atob(match[1]!).split(":")[0] ?? "";
  } catch {
    throw new ConnectError("Unreadable Authorization header", Code.InvalidArgument);
  }
  if (user === "root") {
    throw new ConnectError(
      "User 'root' is refused: commands run as the sandbox's unprivileged user",
      Code.PermissionDenied,
    );
  }
}
