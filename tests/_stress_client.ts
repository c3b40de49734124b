// deno-lint-ignore-file no-console
/**
 * Load and crash helpers for `stress_test.ts` and `integrity_test.ts`, and the
 * child process those tests spawn as an independent host.
 *
 * As a program (`deno run -A tests/_stress_client.ts MODE …`):
 *
 * - `stress QUEUE_DIR DEADLINE_MS PREFIX WORKERS`: submits, collects,
 *   checks, acks and GCs in `WORKERS` loops until the epoch-ms deadline, then
 *   prints one JSON {@linkcode StressSummary} line.
 * - `writer QUEUE_DIR PREFIX BATCH`: prints `ready`, then submits batches of
 *   `BATCH` concurrent requests (one group commit each) until killed, printing
 *   `<toolUseId> <requestId>` once each submit resolved (the request is
 *   durable at that point).
 *
 * @module
 */
import { fileURLToPath } from "node:url";
import { HeartbeatObserver } from "../lib/certify/heartbeat_observer.ts";
import { newSummary, stressLoop } from "../lib/certify/stress_loop.ts";
import { Queue } from "../lib/queue/queue.ts";
import { type QueuePaths, queuePaths } from "../lib/queue/schema.ts";

// The load mix, the loop, the heartbeat observer and the integrity checks are
// the library's (`waffle doctor --deep` runs them too): one harness.
export { HeartbeatObserver, type HeartbeatStats } from "../lib/certify/heartbeat_observer.ts";
export {
  integrityCheck,
  integrityOfQueue,
  type QueueCounts,
  queueCounts,
  recoveredIntegrity,
} from "../lib/certify/integrity.ts";
export {
  newSummary,
  stressLoop,
  type StressRequest,
  stressRequest,
  type StressSummary,
} from "../lib/certify/stress_loop.ts";

/**
 * Sizes in bytes of both queue files.
 *
 * @param queueDir The queue directory.
 * @returns Bytes per file.
 */
export function queueFileSizes(queue: string | QueuePaths): { inbound: number; outbound: number } {
  const paths = typeof queue === "string" ? queuePaths(queue) : queue;
  return {
    inbound: Deno.statSync(paths.inbound).size,
    outbound: Deno.statSync(paths.outbound).size,
  };
}

const JOURNAL_MAGIC = [0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7];

/**
 * Whether a queue file has a hot rollback journal: one whose header SQLite
 * has synced, so the database file may already hold half a transaction and
 * the next connection must roll it back. (A journal of a writer that died
 * before syncing starts with zeros and is ignored.)
 *
 * @param dbPath The database file (not the journal).
 * @returns True when `<dbPath>-journal` starts with the journal magic.
 */
export function hotJournal(dbPath: string): boolean {
  let file: Deno.FsFile;
  try {
    file = Deno.openSync(`${dbPath}-journal`);
  } catch {
    return false;
  }
  try {
    const header = new Uint8Array(JOURNAL_MAGIC.length);
    return file.readSync(header) === header.length &&
      JOURNAL_MAGIC.every((byte, i) => header[i] === byte);
  } finally {
    file.close();
  }
}

/**
 * Busy-polls (without yielding: the writer is another process) until a
 * queue file has a hot journal or the time is up, then SIGKILLs `pid`.
 *
 * @param dbPath The database file the process writes.
 * @param kill Sends the SIGKILL.
 * @param withinMs How long to hunt before killing anyway.
 * @returns True when the kill was aimed at a hot journal.
 */
export function killInsideCommit(dbPath: string, kill: () => void, withinMs: number): boolean {
  const until = Date.now() + withinMs;
  let aimed = false;
  while (Date.now() < until) {
    if (hotJournal(dbPath)) {
      aimed = true;
      break;
    }
  }
  kill();
  return aimed;
}

/**
 * A number from the environment.
 *
 * @param name Variable name.
 * @param fallback Used when unset or not a positive number.
 * @returns The value.
 */
export function envNumber(name: string, fallback: number): number {
  const value = Number(Deno.env.get(name));
  return Number.isFinite(value) && value > 0 ? value : fallback;
}

/**
 * Spawns this file as a child process.
 *
 * @param args Mode and its arguments.
 * @returns The child; stdout is piped, stderr inherited.
 */
export function spawnClient(args: string[]): Deno.ChildProcess {
  const root = fileURLToPath(new URL("../", import.meta.url));
  return new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--quiet", "--no-prompt", fileURLToPath(import.meta.url), ...args],
    cwd: root,
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
}

async function stressMain(
  queueDir: string,
  deadline: number,
  prefix: string,
  workers: number,
): Promise<void> {
  const queue = Queue.open(queueDir);
  const observerQueue = Queue.open(queueDir);
  const observer = new HeartbeatObserver(observerQueue);
  observer.start();
  const summary = newSummary();
  await Promise.all(
    Array.from(
      { length: workers },
      (_, w) => stressLoop(queue, { prefix: `${prefix}w${w}`, deadline, summary }),
    ),
  );
  summary.heartbeat = observer.stop();
  queue.close();
  observerQueue.close();
  console.log(JSON.stringify(summary));
}

async function writerMain(queueDir: string, prefix: string, batch: number): Promise<void> {
  const queue = Queue.open(queueDir);
  console.log("ready");
  // A safety stop in case the parent died without killing us.
  const stopAt = Date.now() + 120_000;
  for (let round = 0; Date.now() < stopAt; round++) {
    await Promise.all(
      Array.from({ length: batch }, (_, i) => {
        const toolUseId = `${prefix}-${round}-${i}`;
        return queue.submit({
          argv: ["sh", "-c", `echo ${toolUseId} >> ran.log; echo ${toolUseId}`],
          toolUseId,
        })
          .then((id) => console.log(`${toolUseId} ${id}`));
      }),
    );
  }
  queue.close();
}

if (import.meta.main) {
  const [mode, queueDir, ...rest] = Deno.args;
  if (mode === "stress" && queueDir !== undefined) {
    await stressMain(queueDir, Number(rest[0]), rest[1] ?? "child", Number(rest[2] ?? 2));
  } else if (mode === "writer" && queueDir !== undefined) {
    await writerMain(queueDir, rest[0] ?? "writer", Number(rest[1] ?? 16));
  } else {
    console.error("usage: _stress_client.ts stress|writer QUEUE_DIR …");
    Deno.exit(2);
  }
}
