/**
 * The compromised runner's attacks, as Deno sources run inside a real
 * container as its uid 0 (`asRunner`, `spawnAsRunner`): one copy of each,
 * shared by the tests that check the host's defence and by `deno task
 * bench`'s attack section, which measures other users while they run.
 *
 * @module
 */

/** Depth of the runner's deep tree: Rust's recursive remove overflowed its stack on it. */
export const TREE_DEPTH = 20_000;

/** How many new inodes the churn gives the bell. */
export const CHURN = 20_000;

// Stops every process whose command line names the runner, except docker-init
// (pid 1, whose arguments name the runner's too) and this script itself.
const FREEZE_RUNNER = `
for (const entry of Deno.readDirSync("/proc")) {
  if (!/^[0-9]+$/.test(entry.name) || entry.name === "1" || entry.name === String(Deno.pid)) continue;
  try {
    const cmdline = Deno.readTextFileSync("/proc/" + entry.name + "/cmdline").split("\\0").join(" ");
    if (cmdline.includes(" runner --queue")) { Deno.kill(Number(entry.name), "SIGSTOP"); frozen++; }
  } catch {
    // Gone meanwhile.
  }
}`;

/**
 * Builds a tree {@linkcode TREE_DEPTH} levels deep at `<dir>/deep`, with
 * links to a victim (its file and its directory, by host paths) at the top
 * and at the bottom: a removal that followed a link would delete them.
 *
 * @param dir Where, inside the container.
 * @param victim Host paths of a victim file and its directory, when links are wanted.
 * @returns The script; it prints `depth N`.
 */
export function deepTreeScript(dir: string, victim?: { file: string; dir: string }): string {
  const links = victim === undefined ? "" : `
    Deno.symlinkSync(${JSON.stringify(victim.file)}, "to-victim");
    Deno.symlinkSync(${JSON.stringify(victim.dir)}, "to-victim-dir");`;
  return `
    Deno.chdir(${JSON.stringify(dir)});
    Deno.mkdirSync("deep");
    Deno.chdir("deep");${links}
    for (let i = 0; i < ${TREE_DEPTH}; i++) {
      Deno.mkdirSync("d");
      Deno.chdir("d");
    }${links}
    Deno.writeTextFileSync("leaf", "x");
    console.log("depth ${TREE_DEPTH}");`;
}

/**
 * Freezes the honest runner (so no commit of its own writes the header
 * back), then overwrites outbound.db's header: the host can no longer read
 * it and resets the directory. Prints `damaged`.
 */
export const DAMAGE_SCRIPT = `
let frozen = 0;${FREEZE_RUNNER}
const file = Deno.openSync("/queue/outbound/outbound.db", { read: true, write: true });
file.writeSync(new Uint8Array(100).fill(0xff));
file.close();
console.log("damaged");`;

/**
 * The damage of {@linkcode DAMAGE_SCRIPT} behind a lock: takes SQLite's
 * EXCLUSIVE lock on `outbound.db` (the PENDING byte and the SHARED range, by
 * fcntl as SQLite does), stops the runner, overwrites the header through the
 * same descriptor (closing any other would drop the locks), prints `ready`
 * and holds the lock for at most `seconds`. A host reading the file meets the
 * lock and serves its last copy, so the damage stays hidden until the
 * container (and this process with it) is killed. x86-64's `struct flock`.
 */
export const LOCKED_DAMAGE_SCRIPT = (seconds: number): string => `
const libc = Deno.dlopen("libc.so.6", {
  open: { parameters: ["buffer", "i32"], result: "i32" },
  fcntl: { parameters: ["i32", "i32", "buffer"], result: "i32" },
  pwrite: { parameters: ["i32", "buffer", "usize", "i64"], result: "isize" },
});
const F_SETLKW = 7, F_WRLCK = 1, O_RDWR = 2;
const fd = libc.symbols.open(new TextEncoder().encode("/queue/outbound/outbound.db\0"), O_RDWR);
if (fd < 0) throw new Error("cannot open outbound.db");
const lock = (start, length) => {
  const flock = new DataView(new ArrayBuffer(32));
  flock.setInt16(0, F_WRLCK, true);
  flock.setBigInt64(8, BigInt(start), true);
  flock.setBigInt64(16, BigInt(length), true);
  if (libc.symbols.fcntl(fd, F_SETLKW, new Uint8Array(flock.buffer)) !== 0) throw new Error("no lock");
};
lock(0x40000000, 1);
lock(0x40000002, 510);
let frozen = 0;${FREEZE_RUNNER}
const junk = new Uint8Array(100).fill(0xff);
if (libc.symbols.pwrite(fd, junk, 100n, 0n) !== 100n) throw new Error("no damage");
console.log("ready");
await new Promise((resolve) => setTimeout(resolve, ${seconds} * 1000));
`;

/**
 * Gives `outbound.bell` a new inode {@linkcode CHURN} times, each old one
 * kept alive by a hard link in /queue/outbound and rung through it (a host
 * watching inodes wakes on it and watches the newest), then rings the new
 * one. Prints `{ tag, churned, inodes }`.
 */
export const CHURN_SCRIPT = `
const dir = "/queue/outbound";
const bell = dir + "/outbound.bell";
const tag = crypto.randomUUID().slice(0, 8);
const inodes = new Set();
const byte = new Uint8Array(1);
for (let i = 0; i < ${CHURN}; i++) {
  const keep = dir + "/old-bell-" + tag + "-" + i;
  Deno.linkSync(bell, keep);
  Deno.writeFileSync(keep, byte);
  Deno.writeFileSync(bell + ".new", byte);
  Deno.renameSync(bell + ".new", bell);
  Deno.writeFileSync(bell, byte);
  inodes.add(Deno.lstatSync(bell).ino);
}
console.log(JSON.stringify({ tag, churned: ${CHURN}, inodes: inodes.size }));
`;

/**
 * Writes a heartbeat a year ahead (state running, a forged boot id), then
 * freezes the runner with SIGSTOP: what sweep used to trust. Prints `{ frozen }`.
 */
export const FORGE_AND_FREEZE_SCRIPT = `
const beat = { runnerId: "forged", bootId: "forged", seq: 1e9, time: Date.now() + 365 * 86400000, state: "running" };
Deno.writeTextFileSync("/queue/outbound/heartbeat.json.forged", JSON.stringify(beat));
Deno.renameSync("/queue/outbound/heartbeat.json.forged", "/queue/outbound/heartbeat.json");
let frozen = 0;${FREEZE_RUNNER}
console.log(JSON.stringify({ frozen }));
`;

/**
 * Grows the runner's outbound.db past 140 MB, its schema intact, through
 * SQLite (the runner's own lock is honoured). Prints `{ bytes }`.
 */
export const GROW_OUTBOUND_SCRIPT = `
import { DatabaseSync } from "node:sqlite";
const db = new DatabaseSync("/queue/outbound/outbound.db");
db.exec("PRAGMA busy_timeout = 5000");
db.exec(\`WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c WHERE x < 2199)
  INSERT INTO chunks SELECT 'forged-request', 'stdout', x, zeroblob(65536) FROM c\`);
db.close();
console.log(JSON.stringify({ bytes: Deno.statSync("/queue/outbound/outbound.db").size }));
`;

/**
 * Takes an EXCLUSIVE lock on outbound.db as the runner's uid and holds it
 * (at most 90 s). Prints `locked` once it holds it.
 */
export const LOCK_SCRIPT = `
import { DatabaseSync } from "node:sqlite";
const db = new DatabaseSync("/queue/outbound/outbound.db");
db.exec("PRAGMA busy_timeout = 10000");
db.exec("BEGIN EXCLUSIVE");
console.log("locked");
setTimeout(() => Deno.exit(0), 90_000);
`;

/** Replaces outbound.db (and its journal) with a FIFO. */
export const FIFO_SCRIPT = `
for (const name of ["outbound.db", "outbound.db-journal"]) {
  try {
    Deno.removeSync("/queue/outbound/" + name);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
}
const made = await new Deno.Command("mkfifo", { args: ["-m", "600", "/queue/outbound/outbound.db"] }).output();
if (!made.success) throw new Error(new TextDecoder().decode(made.stderr));
`;
