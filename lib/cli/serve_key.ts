/**
 * `waffle serve key create|ls|rm`: the API keys of `waffle serve`, each
 * acting as one tenant. A key is printed once, when it is made; the home
 * keeps only its hash.
 *
 * @module
 */
import { absoluteConfigPath, loadWaffleConfig } from "../config/config.ts";
import { UsageError } from "../errors.ts";
import { EXIT_WAFFLE } from "../exit_codes.ts";
import { type KeyInfo, KeyStore } from "../serve/keys.ts";
import { openServeDb } from "../serve/db.ts";
import { noPositionals, parse, type Parsed, stringFlag } from "./args.ts";
import type { CliIo } from "./io.ts";
import { table } from "./report.ts";

/** Help of `waffle serve key`. */
export const SERVE_KEY_HELP = `Usage: waffle serve key <command> [options]

Commands:
  create --tenant T [--name N] [--admin]
                                make a key for tenant T and print it
  ls [--tenant T]               list the keys (never the keys themselves)
  rm ID|NAME [--tenant T]       remove a key
  export                        print every key's owner and hash, for a keys file

A key ('e2b_' and 40 hex digits) is what E2B's SDKs send as E2B_API_KEY; a
request that carries it acts as its tenant. Keys are kept hashed in
$WAFFLE_HOME/serve/serve.db: a key is shown only when it is made.
Run 'waffle serve key <command> --help' for its options.
`;

/** Help of `waffle serve key export`. */
export const SERVE_KEY_EXPORT_HELP = `Usage: waffle serve key export [--config FILE]

Prints every key's id, name, tenant and SHA-256 (never a key) as one JSON
object: the keys file several servers share ([serve] keys_file), e.g. a
Kubernetes Secret mounted into each replica of the server:

  waffle serve key export > keys.json
  kubectl -n waffle-system create secret generic waffle-server-keys --from-file=keys.json
`;

const COMMON = `  --config FILE      the config file (default: $WAFFLE_HOME/waffle.toml)`;

/** Help of `waffle serve key create`. */
export const SERVE_KEY_CREATE_HELP =
  `Usage: waffle serve key create --tenant T [--name N] [--admin] [--json]

Makes a key for tenant T and prints it alone on stdout (with --json, an
object with id, name, tenant, key and admin). It is never shown again.

Options:
  --tenant T         the tenant the key acts as (1-128 of A-Z a-z 0-9 . _ @ + -)
  --name N           its name, unique within the tenant (default: key-<8 hex>)
  --admin            an admin key: it sees and acts on every tenant's sandboxes
                     (the console, an all-tenant GET /metrics); its creates go to T
  --json             print one JSON object
${COMMON}
`;

/** Help of `waffle serve key ls`. */
export const SERVE_KEY_LS_HELP = `Usage: waffle serve key ls [--tenant T] [--json]

Lists the keys: id, name, tenant, admin or not, when made and when last
used (to the minute). Never a key nor its hash.

Options:
  --tenant T         only tenant T's keys
  --json             print one JSON object
${COMMON}
`;

/** Help of `waffle serve key rm`. */
export const SERVE_KEY_RM_HELP = `Usage: waffle serve key rm ID|NAME [--tenant T]

Removes a key, named by its id or its name; requests that carry it are
refused from then on. A name several tenants have needs --tenant.

Options:
  --tenant T         only a key of tenant T
${COMMON}
`;

type Run = (args: string[], io: CliIo) => Promise<number>;

const SUBCOMMANDS: Record<string, { help: string; run: Run }> = {
  create: { help: SERVE_KEY_CREATE_HELP, run: createCommand },
  ls: { help: SERVE_KEY_LS_HELP, run: lsCommand },
  rm: { help: SERVE_KEY_RM_HELP, run: rmCommand },
  export: { help: SERVE_KEY_EXPORT_HELP, run: exportCommand },
};

/**
 * Runs `waffle serve key <command>`.
 *
 * @example
 * ```ts ignore
 * await serveKeyCommand(["create", "--tenant", "acme"], processIo()); // prints e2b_…
 * ```
 *
 * @param args The arguments after `serve key`.
 * @param io Process streams.
 * @returns The exit status: 0, or {@linkcode EXIT_WAFFLE} for a bare `serve key`.
 * @throws {UsageError} On bad arguments, a bad tenant or name, or a key `rm` does not find.
 * @throws {QueueError} When the home's `serve/serve.db` cannot be opened.
 */
export async function serveKeyCommand(args: string[], io: CliIo): Promise<number> {
  const [name, ...rest] = args;
  if (name === undefined || name === "--help" || name === "-h") {
    await io.stdout(SERVE_KEY_HELP);
    return name === undefined ? EXIT_WAFFLE : 0;
  }
  const sub = Object.hasOwn(SUBCOMMANDS, name) ? SUBCOMMANDS[name] : undefined;
  if (sub === undefined) {
    throw new UsageError(`Unknown command 'serve key ${name}'; run 'waffle serve key --help'`);
  }
  if (rest.includes("--help") && !rest.slice(0, rest.indexOf("--help")).includes("--")) {
    await io.stdout(sub.help);
    return 0;
  }
  return await sub.run(rest, io);
}

const OPTIONS = {
  tenant: { type: "string" },
  config: { type: "string" },
  json: { type: "boolean" },
} as const;

async function createCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, { ...OPTIONS, name: { type: "string" }, admin: { type: "boolean" } });
  noPositionals(parsed.positionals);
  const tenant = stringFlag(parsed, "tenant");
  if (tenant === undefined) throw new UsageError("Missing --tenant T: the tenant the key acts as");
  const created = withStore(
    parsed,
    (keys) =>
      keys.create({
        tenant,
        name: stringFlag(parsed, "name"),
        admin: parsed.values.admin === true,
      }),
  );
  await io.stdout(parsed.values.json ? `${JSON.stringify(created)}\n` : `${created.key}\n`);
  return 0;
}

async function lsCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, OPTIONS);
  noPositionals(parsed.positionals);
  const keys = withStore(parsed, (store) => store.list({ tenant: stringFlag(parsed, "tenant") }));
  if (parsed.values.json) {
    await io.stdout(`${JSON.stringify({ keys: keys.map(jsonOf) })}\n`);
    return 0;
  }
  const rows = [["ID", "NAME", "TENANT", "ADMIN", "CREATED", "LAST USED"]];
  for (const key of keys) {
    rows.push([
      key.id,
      key.name,
      key.tenant,
      key.admin ? "yes" : "-",
      timeOf(key.createdAt),
      timeOf(key.lastUsedAt),
    ]);
  }
  await io.stdout(table(rows));
  return 0;
}

async function rmCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, { tenant: OPTIONS.tenant, config: OPTIONS.config });
  const [which, ...extra] = parsed.positionals;
  if (which === undefined) throw new UsageError("Missing key: use 'serve key rm ID|NAME'");
  noPositionals(extra);
  const tenant = stringFlag(parsed, "tenant");
  const removed = withStore(parsed, (keys) => keys.remove(which, { tenant }));
  if (!removed) {
    throw new UsageError(
      `No key '${which}'${
        tenant === undefined ? "" : ` in tenant '${tenant}'`
      }; see 'waffle serve key ls'`,
    );
  }
  await io.stdout(`removed key '${which}'\n`);
  return 0;
}

async function exportCommand(args: string[], io: CliIo): Promise<number> {
  const parsed = parse(args, { config: OPTIONS.config });
  noPositionals(parsed.positionals);
  const keys = withStore(parsed, (store) => store.export());
  await io.stdout(`${JSON.stringify({ keys })}\n`);
  return 0;
}

// Opens the home's key store (the config names the home), runs `fn`, closes it.
function withStore<T>(parsed: Parsed, fn: (keys: KeyStore) => T): T {
  const configPath = stringFlag(parsed, "config");
  const config = loadWaffleConfig(
    configPath === undefined ? {} : { configPath: absoluteConfigPath(configPath) },
  );
  const db = openServeDb(config.sandbox.home);
  try {
    return fn(new KeyStore(db));
  } finally {
    db.close();
  }
}

function jsonOf(key: KeyInfo): Record<string, unknown> {
  return {
    ...key,
    createdAt: new Date(key.createdAt).toISOString(),
    lastUsedAt: key.lastUsedAt === null ? null : new Date(key.lastUsedAt).toISOString(),
  };
}

// UTC to the second: the same on every host that reads the file.
function timeOf(ms: number | null): string {
  return ms === null ? "-" : new Date(ms).toISOString().replace(/\.\d+Z$/, "Z");
}
