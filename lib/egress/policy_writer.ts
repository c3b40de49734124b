/**
 * The host's writes for egress that every call of an attached sandbox
 * makes, warm ones included, so they stay light (no Node modules): the
 * identity's policy file with its secrets read now, and the control call
 * that tells the proxy to serve it.
 *
 * @module
 */
import { DockerError } from "../errors.ts";
import { hostCanChown } from "../lifecycle/posture.ts";
import { type EgressPaths, homeEgress, identityPaths } from "../config/egress_paths.ts";
import type { EgressAttachment, SecretConfig } from "../config/egress_types.ts";
import { placeholderOf } from "../config/egress_launch.ts";
import { parsePolicyFile, type PolicyFile } from "./policy_file.ts";
import { proxyUser } from "./proxy_container.ts";
import type { HeldSecret } from "./inject.ts";

/** The largest secret file read. */
const MAX_SECRET_BYTES = 64 * 1024;

// The identity's policy file and socket directory (made by the host, so the
// proxy can write in it but never replace it).
export function writePolicy(home: string, attachment: EgressAttachment): void {
  const paths = homeEgress(home);
  const own = identityPaths(paths, attachment.id);
  const { uid, gid } = proxyUser();
  Deno.mkdirSync(own.dir, { recursive: true, mode: 0o775 });
  const stat = Deno.lstatSync(own.dir);
  if (!stat.isDirectory) {
    throw new DockerError(`Egress socket directory '${own.dir}' is not a directory`);
  }
  if (hostCanChown()) Deno.chownSync(own.dir, 0, gid);
  Deno.chmodSync(own.dir, 0o775);
  const before = previousSecrets(own.policy);
  const file: PolicyFile = {
    version: 1,
    id: attachment.id,
    identity: attachment.identity,
    allow: attachment.policy.allow,
    addresses: attachment.policy.addresses,
    allowHost: attachment.policy.allowHost,
    secrets: attachment.policy.secrets.flatMap((secret) => {
      const value = readSecret(secret) ?? before.get(secret.name);
      return value === undefined ? [] : [held(home, { attachment, secret, value })];
    }),
    maxConnections: attachment.settings.maxConnections,
    bytesPerSecond: attachment.settings.bytesPerSecond,
    hosts: attachment.settings.hosts,
  };
  writeOwned(own.policy, `${JSON.stringify(file)}\n`, { mode: 0o600, owner: { uid, gid } });
}

function held(
  home: string,
  options: { attachment: EgressAttachment; secret: SecretConfig; value: string },
): HeldSecret {
  const { secret, value } = options;
  return {
    name: secret.name,
    hosts: secret.hosts,
    header: secret.header,
    format: secret.format,
    placeholder: placeholderOf(home, { id: options.attachment.id, secret: secret.name }),
    value,
  };
}

function previousSecrets(path: string): Map<string, string> {
  try {
    const file = parsePolicyFile(Deno.readTextFileSync(path));
    return new Map(file.secrets.map((secret) => [secret.name, secret.value]));
  } catch {
    return new Map();
  }
}

/**
 * A secret's value as this host process can read it now; undefined when its
 * variable is unset or its file unreadable. A value with CR, LF or NUL is
 * refused: it would end the header it is written into.
 *
 * @param secret The secret.
 * @returns The value, or undefined.
 * @throws {DockerError} When the value contains CR, LF or NUL.
 */
export function readSecret(secret: SecretConfig): string | undefined {
  let value: string | undefined;
  if ("env" in secret.source) {
    value = Deno.env.get(secret.source.env);
  } else {
    try {
      const bytes = Deno.readFileSync(secret.source.file);
      if (bytes.length > MAX_SECRET_BYTES) {
        throw new DockerError(
          `Secret '${secret.name}': file '${secret.source.file}' is larger than ${MAX_SECRET_BYTES} bytes`,
        );
      }
      value = new TextDecoder().decode(bytes).replace(/\r?\n$/, "");
    } catch (error) {
      if (error instanceof DockerError) throw error;
      value = undefined;
    }
  }
  if (value !== undefined && /[\0\r\n]/.test(value)) {
    throw new DockerError(
      `Secret '${secret.name}' contains CR, LF or NUL; it cannot go in a header`,
    );
  }
  return value === "" ? undefined : value;
}

// Temp file, then rename: a reader never sees half of it.
export function writeOwned(
  path: string,
  text: string,
  options: { mode: number; owner?: { uid: number; gid: number } },
): void {
  try {
    if (Deno.readTextFileSync(path) === text) return;
  } catch {
    // absent: written below
  }
  const temp = `${path}.${crypto.randomUUID().slice(0, 8)}.tmp`;
  Deno.writeTextFileSync(temp, text, { createNew: true, mode: options.mode });
  try {
    if (options.owner !== undefined && hostCanChown()) {
      Deno.chownSync(temp, options.owner.uid, options.owner.gid);
    }
    Deno.chmodSync(temp, options.mode);
    Deno.renameSync(temp, path);
  } catch (error) {
    Deno.removeSync(temp);
    throw error;
  }
}

/**
 * Forgets an identity (its sandbox was purged): its policy file goes, and
 * with it the proxy's listener at the next sync; its socket directory goes
 * too. Nothing happens for an identity without files.
 *
 * @param home The waffle home.
 * @param id The identity's id.
 */
export async function forgetIdentity(home: string, id: string): Promise<void> {
  const paths = homeEgress(home);
  const own = identityPaths(paths, id);
  try {
    Deno.removeSync(own.policy);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  await controlCall(paths, "sync").catch(() => {});
  // The proxy writes in it: removed like any tree another party shaped.
  const { removeTree } = await import("../lifecycle/remove_tree.ts");
  await removeTree(own.dir).catch(() => false);
}

/**
 * Sends one command to the proxy's control socket and returns its answer.
 *
 * @param paths The egress directory.
 * @param command `ping` or `sync`.
 * @returns The answer line after `ok`.
 * @throws {DockerError} When the proxy does not answer `ok` within 5 s.
 */
export async function controlCall(paths: EgressPaths, command: string): Promise<string> {
  const conn = await Deno.connect({ transport: "unix", path: paths.control });
  const timer = setTimeout(() => conn.close(), 5000);
  try {
    await conn.write(new TextEncoder().encode(`${command}\n`));
    const chunks: Uint8Array[] = [];
    const buffer = new Uint8Array(256);
    for (let total = 0; total < 4096;) {
      const n = await conn.read(buffer);
      if (n === null) break;
      chunks.push(buffer.slice(0, n));
      total += n;
    }
    const answer = chunks.map((chunk) => new TextDecoder().decode(chunk)).join("").trim();
    if (!answer.startsWith("ok")) {
      throw new DockerError(`The egress proxy answered '${answer}' to '${command}'`);
    }
    return answer.slice(2).trim();
  } finally {
    clearTimeout(timer);
    try {
      conn.close();
    } catch {
      // closed by the timer
    }
  }
}
