/**
 * A pseudo-terminal for a terminal session (`waffle shell`): the runner
 * holds the master; the spawn helper opens the slave as the command's
 * controlling terminal and stdin, stdout and stderr (`spawn --tty`). The
 * kernel's line discipline then does what a terminal does: Ctrl-C and
 * Ctrl-\ become SIGINT and SIGQUIT of the foreground process group, and a
 * new window size SIGWINCH.
 *
 * Deno has no pty API, so this is libc through FFI: the master is opened
 * non-blocking and close-on-exec (no command inherits it), read when
 * `poll` (on a thread of its own) says so, so the event loop never blocks.
 *
 * @module
 */
import type { TtySize } from "../lib/queue/protocol.ts";
import {
  EAGAIN,
  EINTR,
  errno,
  libc,
  O_CLOEXEC,
  O_NOCTTY,
  O_NONBLOCK,
  O_RDWR,
  POLLIN,
  POLLOUT,
} from "../lib/libc.ts";
import { logLine } from "./log.ts";

// <asm-generic/ioctls.h> (x86_64 and aarch64 alike).
const TIOCSWINSZ = 0x5414n;
const TIOCGPTN = 0x80045430n;
const TIOCSPTLCK = 0x40045431n;
const POLL_MS = 250;
const READ_BYTES = 64 * 1024;

/** An open pty master and the slave's path. */
export interface Pty {
  /** The slave, for `spawn --tty`. */
  readonly slave: string;
  /** What the command writes to its terminal. Ends when every slave fd is closed. */
  readonly output: ReadableStream<Uint8Array>;
  /** What the command reads from its terminal (the user's keys). */
  readonly input: WritableStream<Uint8Array>;
  /** Sets the window size (the kernel signals SIGWINCH to the foreground group). */
  resize(size: TtySize): void;
  /** Closes the master (ends `output`). */
  close(): void;
}

/**
 * Opens a pty of the given size.
 *
 * @param size The initial window size.
 * @returns The pty.
 * @throws {Error} When libc or `/dev/ptmx` is not available.
 */
export function openPty(size: TtySize): Pty {
  const lib = libc();
  if (lib === undefined) throw new Error("No libc for a terminal");
  let fd = lib.open(cString("/dev/ptmx"), O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC, 0);
  if (fd < 0) throw new Error(`Cannot open '/dev/ptmx': errno ${errno(lib)}`);
  const number = new Int32Array(1);
  if (
    lib.ioctl(fd, TIOCSPTLCK, new Int32Array([0])) !== 0 || lib.ioctl(fd, TIOCGPTN, number) !== 0
  ) {
    const error = errno(lib);
    lib.close(fd);
    throw new Error(`Cannot unlock the pty: errno ${error}`);
  }
  // The fd is closed only once no poll holds it: a number reused by the next
  // open must never be polled, read or written here.
  let closed = false;
  let polling = 0;
  const release = (): void => {
    if (closed && polling === 0 && fd >= 0) {
      lib.close(fd);
      fd = -1;
    }
  };
  const resize = (to: TtySize): void => {
    if (!closed) lib.ioctl(fd, TIOCSWINSZ, new Uint16Array([to.rows, to.cols, 0, 0]));
  };
  resize(size);
  const ready = async (events: number): Promise<boolean> => {
    const pollfd = new Int32Array([fd, events]);
    while (!closed) {
      polling++;
      const n = await lib.poll(pollfd, 1n, POLL_MS).finally(() => polling--);
      // Readable, writable, hung up or an error: the read or write says which.
      if (n > 0 && !closed) return true;
    }
    release();
    return false;
  };
  const output = new ReadableStream<Uint8Array>({
    pull: async (controller) => {
      while (await ready(POLLIN)) {
        const buffer = new Uint8Array(READ_BYTES);
        const got = Number(lib.read(fd, buffer, BigInt(READ_BYTES)));
        if (got > 0) return controller.enqueue(buffer.subarray(0, got));
        const error = got < 0 ? errno(lib) : 0;
        if (got < 0 && (error === EAGAIN || error === EINTR)) continue;
        break; // EIO: the last slave fd closed (the command and its tree are gone)
      }
      controller.close();
    },
  }, { highWaterMark: 0 });
  const input = new WritableStream<Uint8Array>({
    write: async (data) => {
      let rest = data;
      while (rest.byteLength > 0 && !closed) {
        const put = Number(lib.write(fd, rest, BigInt(rest.byteLength)));
        if (put > 0) {
          rest = rest.subarray(put);
        } else if (put < 0 && errno(lib) !== EAGAIN && errno(lib) !== EINTR) {
          return;
        } else if (!await ready(POLLOUT)) {
          return;
        }
      }
    },
  });
  return {
    slave: `/dev/pts/${number[0]}`,
    output,
    input,
    resize,
    close: () => {
      closed = true;
      release();
    },
  };
}

/**
 * Makes the container's pty multiplexer the runner's alone (mode 0600; the
 * runner is uid 0 and owns it, so no capability is needed): a command cannot
 * open ptys of its own, and so cannot exhaust `kernel.pty.max`, which every
 * container on the host shares. `waffle shell` still works: the runner opens
 * the pty and hands the command its slave.
 */
export function reservePtys(): void {
  try {
    Deno.chmodSync("/dev/pts/ptmx", 0o600);
  } catch (error) {
    logLine(
      `cannot reserve the pty multiplexer: ${error instanceof Error ? error.message : error}`,
    );
  }
}

function cString(text: string): Uint8Array {
  return new TextEncoder().encode(`${text}\0`);
}
