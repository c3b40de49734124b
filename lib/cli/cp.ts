/**
 * `waffle cp`: files in and out of a sandbox, in Docker's form. Every path
 * inside the sandbox is resolved by `waffle files` running inside it as the
 * commands' uid; the host only streams bytes, and extracts what comes out
 * fresh, under a new directory: files, directories and symbolic links (as
 * links, never followed), refusing anything else.
 *
 * @module
 */
import { absoluteConfigPath } from "../config/config.ts";
import { createHash, type Hash } from "node:crypto";
import { FilesError, UsageError } from "../errors.ts";
import { basename, resolve } from "../path.ts";
import { openSandbox } from "../sandbox/open.ts";
import {
  entryComponents,
  extractTar,
  LinkGuard,
  linkTarget,
  refuseSpecial,
  rootNameOf,
} from "../files/extract.ts";
import { packInSandbox, unpackInSandbox } from "../files/mod.ts";
import { type LinkPolicy, newStats, type PackStats, packTree } from "../files/pack.ts";
import { padding, readTar, TAR_END, tarHeader } from "../files/tar.ts";
import { escapeControls } from "../terminal/control_text.ts";
import { numberFlag, parse, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";

/** Help text of `waffle cp`. */
export const CP_HELP = `Usage: waffle cp [options] USER:PATH HOSTPATH|-
       waffle cp [options] HOSTPATH|- USER:PATH

Copies a file or a directory (recursively) between the host and USER's
sandbox. PATH is inside the sandbox (relative: under the workspace). '-' is
a tar stream on stdin (copied into the directory USER:PATH) or on stdout.

Regular files, directories and symbolic links are copied; a symbolic link
is copied as a link (its target text unchanged, as docker cp does), never
followed on either side, and nothing is ever written through a link the copy
made. A hard link tar entry, FIFO, socket or device, a name with '..' or an
absolute name refuses the whole copy with one line naming it, and nothing is
left; setuid, setgid and sticky bits are stripped (named on stderr). A
destination directory is never merged into: copying onto an existing
directory DIR puts the copy at DIR/NAME, which must not exist yet.

Options:
  --tenant T         tenant of the user (default: "default")
  --image REF        runner image (default: the config's)
  --config FILE      the config file (default: $WAFFLE_HOME/waffle.toml)
  --json             print sizes, SHA-256 (of a single file; of the tar stream
                     otherwise) and the elapsed time as one JSON object
  --progress         progress on stderr (default: when stderr is a terminal)
  --max-bytes N      refuse a copy out past N bytes of file data (default: the sandbox's
                     quota_bytes, so a sparse file cannot fill the host's disk)
  --no-links         leave symbolic links out (their count on stderr and in --json)
`;

interface Remote {
  user: string;
  path: string;
}

const REMOTE = /^([A-Za-z0-9][A-Za-z0-9._-]{0,63}):(.*)$/s;

function remoteOf(arg: string): Remote | undefined {
  if (arg.startsWith("/") || arg.startsWith(".")) return undefined;
  const match = REMOTE.exec(arg);
  return match === null ? undefined : { user: match[1]!, path: match[2]! };
}

/**
 * Counts and reports the bytes that pass, and hashes them only for
 * `--json` (a SHA-256 costs about a second of CPU per GiB).
 */
class Meter {
  /** The tar stream's digest; undefined when not wanted. */
  tar: Hash | undefined;
  /** A single file's digest; undefined when not wanted. */
  readonly file: Hash | undefined;
  tarBytes = 0;
  readonly started = performance.now();
  #lastShown = performance.now();
  #lastBytes = 0;
  constructor(
    readonly progress: ((line: string) => Promise<void>) | undefined,
    digests: { tar: boolean; file: boolean },
  ) {
    this.tar = digests.tar ? createHash("sha256") : undefined;
    this.file = digests.file ? createHash("sha256") : undefined;
  }

  /** Sees a file's data (for a single file's digest), or undefined when nobody wants it. */
  get onFileData(): ((chunk: Uint8Array) => void) | undefined {
    const file = this.file;
    return file === undefined ? undefined : (chunk) => file.update(chunk);
  }

  async *tap(source: AsyncIterable<Uint8Array>): AsyncGenerator<Uint8Array> {
    for await (const chunk of source) {
      this.tar?.update(chunk);
      this.tarBytes += chunk.byteLength;
      if (this.progress !== undefined) await this.#report();
      yield chunk;
    }
  }

  async #report(): Promise<void> {
    if (this.progress === undefined) return;
    const now = performance.now();
    if (now - this.#lastShown < 1000 && this.tarBytes - this.#lastBytes < 64 * 1024 ** 2) return;
    this.#lastShown = now;
    this.#lastBytes = this.tarBytes;
    const seconds = (now - this.started) / 1000;
    await this.progress(
      `waffle cp: ${(this.tarBytes / 1024 ** 2).toFixed(1)} MiB in ${seconds.toFixed(1)} s (${
        (this.tarBytes / 1e6 / Math.max(seconds, 0.001)).toFixed(1)
      } MB/s)\n`,
    );
  }
}

/**
 * Runs `waffle cp`.
 *
 * @param args Arguments after `cp`.
 * @param io Process streams.
 * @returns The exit status.
 */
export async function cpCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, {
    tenant: { type: "string" },
    image: { type: "string" },
    config: { type: "string" },
    json: { type: "boolean" },
    progress: { type: "boolean" },
    "max-bytes": { type: "string" },
    "no-links": { type: "boolean" },
  });
  const [src, dst, ...extra] = parsed.positionals;
  if (src === undefined || dst === undefined || extra.length > 0) {
    throw new UsageError("Expected SRC and DST: 'waffle cp USER:PATH HOSTPATH' or the reverse");
  }
  const from = remoteOf(src);
  const to = remoteOf(dst);
  if ((from === undefined) === (to === undefined)) {
    throw new UsageError(
      `Exactly one of '${src}' and '${dst}' must be USER:PATH (a host path with ':' can be given as './${
        from === undefined ? src : dst
      }')`,
    );
  }
  const remote = (from ?? to)!;
  if (remote.path === "") throw new UsageError(`Empty sandbox path in '${from ? src : dst}'`);
  const maxBytesFlag = numberFlag(parsed, "max-bytes", { integer: true });
  const image = stringFlag(parsed, "image");
  const configPath = stringFlag(parsed, "config");
  const showProgress = parsed.values.progress === true || Deno.stderr.isTerminal();
  const json = parsed.values.json === true;
  const links: LinkPolicy = parsed.values["no-links"] === true ? "skip" : "copy";
  // --json gives a single file's digest, else the tar stream's: only what it gives is hashed.
  const hostFile = to !== undefined && src !== "-" && isRegularFile(resolve(src));
  const meter = new Meter(showProgress ? (line) => io.stderr(line) : undefined, {
    file: json && src !== "-" && dst !== "-",
    tar: json && !hostFile && dst !== "-",
  });
  const sandbox = openSandbox(remote.user, {
    tenant: stringFlag(parsed, "tenant") ?? "default",
    config: {
      ...(image === undefined ? {} : { image }),
      ...(configPath === undefined ? {} : { configPath: absoluteConfigPath(configPath) }),
    },
  });
  // More data than the sandbox may hold can only be sparse files written out whole.
  const maxBytes = maxBytesFlag ?? sandbox.config.quotaBytes;
  let stats: PackStats = newStats();
  let stripped: string[] = [];
  try {
    if (to !== undefined) {
      if (src === "-") {
        if (io.stdin === null) throw new UsageError("Stdin is a terminal: '-' needs a tar stream");
        const done = await unpackInSandbox(sandbox, meter.tap(io.stdin), {
          dest: to.path,
          links,
        });
        stats = done;
        stripped = done.stripped;
      } else {
        const host = resolve(src);
        const name = basename(host);
        const done = await unpackInSandbox(
          sandbox,
          meter.tap(
            packTree(host, name, {
              special: "refuse",
              links,
              ...optional("onFileData", meter.onFileData),
              stats,
            }),
          ),
          { dest: to.path, rootName: name },
        );
        stripped = done.stripped;
      }
    } else {
      const name = rootNameOf(from!.path, "workspace");
      const tar = meter.tap(packInSandbox(sandbox, from!.path, name));
      if (dst === "-") {
        const limits = { maxBytes, stats, stripped, json, links };
        for await (const chunk of sanitized(tar, name, limits, meter)) {
          await io.stdout(chunk);
        }
      } else {
        const done = await extractTar(tar, dst, {
          rootName: name,
          maxBytes,
          stats,
          links,
          ...optional("onFileData", meter.onFileData),
        });
        stripped = done.stripped;
      }
    }
  } finally {
    sandbox.close();
  }
  if (stats.skippedLinks > 0) {
    await io.stderr(`waffle: skipped ${stats.skippedLinks} symbolic link(s) (--no-links)\n`);
  }
  for (const name of stripped.slice(0, 20)) {
    await io.stderr(
      `waffle: stripped the setuid, setgid or sticky bit of '${escapeControls(name)}'\n`,
    );
  }
  if (json) {
    const elapsedMs = performance.now() - meter.started;
    const single = src !== "-" && dst !== "-" && stats.files === 1 && stats.directories === 0;
    await io.stdout(
      JSON.stringify({
        direction: to === undefined ? "out" : "in",
        source: src,
        destination: dst,
        bytes: stats.bytes,
        files: stats.files,
        directories: stats.directories,
        links: stats.links,
        skippedLinks: stats.skippedLinks,
        tarBytes: meter.tarBytes,
        sha256: (single ? meter.file : meter.tar)?.digest("hex") ?? null,
        sha256Of: single ? "file" : "tar",
        elapsedMs: Math.round(elapsedMs),
        mbPerSecond: Number((meter.tarBytes / 1e6 / Math.max(elapsedMs / 1000, 0.001)).toFixed(1)),
        stripped,
      }) + "\n",
    );
  }
  return 0;
}

function isRegularFile(path: string): boolean {
  try {
    return Deno.lstatSync(path).isFile;
  } catch {
    return false;
  }
}

// An optional option, absent rather than undefined.
function optional<K extends string, V>(key: K, value: V | undefined): { [k in K]?: V } {
  return value === undefined ? {} : { [key]: value } as { [k in K]: V };
}

// A copy out to stdout: the sandbox's archive checked entry by entry by the
// host's rules and written again with headers the host makes itself.
async function* sanitized(
  tar: AsyncIterable<Uint8Array>,
  rootName: string,
  limits: {
    maxBytes: number;
    stats: PackStats;
    stripped: string[];
    json: boolean;
    links: LinkPolicy;
  },
  meter: Meter,
): AsyncGenerator<Uint8Array> {
  const { maxBytes, stats, stripped } = limits;
  let entries = 0;
  // A reader's tar may follow a link to write a later entry: none is under one.
  const made = new LinkGuard();
  const out = limits.json ? createHash("sha256") : undefined;
  for await (const { header, body } of readTar(tar)) {
    const parts = entryComponents(header.name);
    refuseSpecial(header);
    if (parts.length === 0) continue;
    if (parts[0] !== rootName) {
      throw new FilesError(`Refused entry '${header.name}': outside the copied '${rootName}'`);
    }
    if (++entries > 1_000_000) throw new FilesError("Refused the copy: more than 1000000 entries");
    if (stats.bytes + header.size > maxBytes) {
      throw new FilesError(
        `Refused entry '${header.name}': the copy would exceed ${maxBytes} bytes`,
      );
    }
    made.check(parts);
    const link = header.type === "symlink" ? linkTarget(header) : undefined;
    if (link !== undefined && limits.links === "skip") {
      stats.skippedLinks++;
      continue;
    }
    if ((header.mode & 0o7000) !== 0) stripped.push(parts.join("/"));
    const head = tarHeader({
      name: parts.join("/"),
      type: header.type,
      size: header.type === "file" ? header.size : 0,
      mode: header.mode & 0o777,
      mtime: header.mtime,
      ...(link === undefined ? {} : { linkname: link }),
    });
    out?.update(head);
    yield head;
    if (header.type === "directory") {
      stats.directories++;
      continue;
    }
    if (link !== undefined) {
      made.add(parts.join("/"));
      stats.links++;
      continue;
    }
    for await (const chunk of body) {
      out?.update(chunk);
      yield chunk;
    }
    const pad = padding(header.size);
    out?.update(pad);
    yield pad;
    stats.files++;
    stats.bytes += header.size;
  }
  out?.update(TAR_END);
  yield TAR_END;
  // The digest --json gives for '-' is of the stream written to stdout.
  meter.tar = out;
}
