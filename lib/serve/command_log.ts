/**
 * The recent commands of each sandbox, for the console: every process the
 * server's envd starts (or takes over after a restart) is recorded from its
 * events: its argv, working directory, start, end, exit, and the last
 * {@linkcode TAIL_BYTES} of each stream. Bounded: at most
 * {@linkcode COMMANDS_KEPT} commands per sandbox, each tail a fixed ring, so
 * a command writing gigabytes costs the server 8 KiB. Kept in memory: a
 * server started again knows the commands it takes over, not those that
 * ended before.
 *
 * @module
 */
import type { ProcessConfig, ProcessEvent } from "./processes.ts";
import type { ConsoleCommand } from "./console_types.ts";

export type { ConsoleCommand };

/** Bytes of each stream's tail kept per command. */
export const TAIL_BYTES = 4096;
/** Commands kept per sandbox, newest. */
export const COMMANDS_KEPT = 200;
/** Characters of each argv word kept. */
export const ARGV_WORD_CHARS = 1024;
/** Characters of a whole argv kept. */
export const ARGV_TOTAL_CHARS = 8192;

/**
 * An argv as the console keeps it: each word cut to
 * {@linkcode ARGV_WORD_CHARS}, the whole to {@linkcode ARGV_TOTAL_CHARS}
 * (a command may send ~2 MiB), a cut word ending in `…`.
 *
 * @param argv Program and arguments, as started.
 * @param options `total`: the whole's cap (default {@linkcode ARGV_TOTAL_CHARS}).
 * @returns The capped argv and whether anything was cut.
 */
export function capArgv(
  argv: readonly string[],
  options: { total?: number } = {},
): { argv: string[]; truncated: boolean } {
  let left = options.total ?? ARGV_TOTAL_CHARS;
  const capped: string[] = [];
  let truncated = false;
  for (const word of argv) {
    if (left === 0) {
      // Words left over: the last kept one shows the cut.
      truncated = true;
      const last = capped.pop() ?? "";
      capped.push(last.endsWith("…") ? last : `${last.slice(0, -1)}…`);
      break;
    }
    const room = Math.min(ARGV_WORD_CHARS, left);
    const kept = word.length <= room ? word : `${word.slice(0, room - 1)}…`;
    truncated ||= kept !== word;
    capped.push(kept);
    left -= kept.length;
  }
  return { argv: capped, truncated };
}

interface Kept {
  id: string;
  pid: number;
  argv: string[];
  argvTruncated: boolean;
  cwd: string | null;
  startedAt: number;
  endedAt: number | null;
  exitCode: number | null;
  signal: number | null;
  stdout: Tail;
  stderr: Tail;
}

/** The last bytes of a stream: a fixed buffer, never more. */
class Tail {
  readonly #bytes = new Uint8Array(TAIL_BYTES);
  #length = 0;
  truncated = false;

  push(data: Uint8Array): void {
    if (data.byteLength >= TAIL_BYTES) {
      this.#bytes.set(data.subarray(data.byteLength - TAIL_BYTES));
      this.truncated ||= data.byteLength > TAIL_BYTES || this.#length > 0;
      this.#length = TAIL_BYTES;
      return;
    }
    const keep = Math.min(this.#length, TAIL_BYTES - data.byteLength);
    if (keep < this.#length) this.truncated = true;
    this.#bytes.copyWithin(0, this.#length - keep, this.#length);
    this.#bytes.set(data, keep);
    this.#length = keep + data.byteLength;
  }

  text(): string {
    return new TextDecoder("utf-8", { fatal: false }).decode(this.#bytes.subarray(0, this.#length));
  }
}

const SIGNALS: Record<string, number> = {
  hup: 1,
  int: 2,
  quit: 3,
  abrt: 6,
  killed: 9,
  kill: 9,
  segv: 11,
  pipe: 13,
  alrm: 14,
  terminated: 15,
  term: 15,
};

/** Every sandbox's recent commands. */
export class CommandLog {
  readonly #bySandbox = new Map<string, Kept[]>();
  readonly #now: () => number;

  /** @param options `now`: the clock (tests). */
  constructor(options: { now?: () => number } = {}) {
    this.#now = options.now ?? Date.now;
  }

  /**
   * Records a process from its start (or take-over): the listener to add to its events.
   *
   * @param sandbox The sandbox id.
   * @param process Its request id, envd pid and config.
   * @returns A listener of its events (it never holds the output back).
   */
  watch(
    sandbox: string,
    process: { requestId: string; pid: number; config: ProcessConfig },
  ): (event: ProcessEvent) => undefined {
    const argv = capArgv([process.config.cmd, ...process.config.args]);
    const kept: Kept = {
      id: process.requestId,
      pid: process.pid,
      argv: argv.argv,
      argvTruncated: argv.truncated,
      cwd: process.config.cwd ?? null,
      startedAt: this.#now(),
      endedAt: null,
      exitCode: null,
      signal: null,
      stdout: new Tail(),
      stderr: new Tail(),
    };
    let list = this.#bySandbox.get(sandbox);
    if (list === undefined) this.#bySandbox.set(sandbox, list = []);
    list.push(kept);
    if (list.length > COMMANDS_KEPT) list.splice(0, list.length - COMMANDS_KEPT);
    return (event) => {
      if (event.kind === "data") {
        (event.stream === "stderr" ? kept.stderr : kept.stdout).push(event.data);
      }
      if (event.kind === "end") {
        kept.endedAt = this.#now();
        kept.exitCode = event.exited ? event.exitCode : null;
        const signal = /^signal: (\w+)/.exec(event.status)?.[1];
        kept.signal = signal === undefined ? null : SIGNALS[signal] ?? null;
      }
      return undefined;
    };
  }

  /**
   * A sandbox's commands, newest first.
   *
   * @param sandbox The sandbox id.
   * @param limit The most returned.
   * @returns The commands.
   */
  list(sandbox: string, limit: number): ConsoleCommand[] {
    const list = this.#bySandbox.get(sandbox) ?? [];
    return list.slice(-Math.max(1, limit)).reverse().map((kept) => ({
      id: kept.id,
      pid: kept.endedAt === null ? kept.pid : null,
      argv: kept.argv,
      ...(kept.argvTruncated ? { argvTruncated: true as const } : {}),
      cwd: kept.cwd,
      startedAt: new Date(kept.startedAt).toISOString(),
      endedAt: kept.endedAt === null ? null : new Date(kept.endedAt).toISOString(),
      durationMs: kept.endedAt === null ? null : kept.endedAt - kept.startedAt,
      exitCode: kept.exitCode,
      signal: kept.signal,
      running: kept.endedAt === null,
      stdoutTail: kept.stdout.text(),
      stderrTail: kept.stderr.text(),
      truncated: kept.stdout.truncated || kept.stderr.truncated,
    }));
  }

  /**
   * Forgets a sandbox's commands (it was removed).
   *
   * @param sandbox The sandbox id.
   */
  forget(sandbox: string): void {
    this.#bySandbox.delete(sandbox);
  }
}
