/**
 * Argument parsing shared by the subcommands: `util.parseArgs` with every
 * failure turned into a one-line {@linkcode UsageError}.
 *
 * It is `@pkgjs/parseargs`, the Node.js project's own package of the same
 * code, not `node:util`: importing one of Deno's Node modules costs ~12 ms of
 * every process start, and `waffle exec` is started per command.
 *
 * @module
 */
import type { ParseArgsConfig } from "node:util";
import { parseArgs as untypedParseArgs } from "@pkgjs/parseargs";
import { UsageError } from "../errors.ts";

// The package ships no types; its API is node:util's (types only, erased).
const parseArgs = untypedParseArgs as typeof import("node:util").parseArgs;

/** The parsed flags and positionals of one subcommand. */
export interface Parsed {
  values: Record<string, string | boolean | string[] | boolean[] | undefined>;
  positionals: string[];
}

/**
 * Parses `args` strictly against `options`.
 *
 * @param args The arguments after the subcommand.
 * @param options parseArgs option definitions.
 * @returns Flags and positionals.
 * @throws {UsageError} On an unknown flag, a missing value or a stray positional.
 */
export function parse(args: string[], options: ParseArgsConfig["options"]): Parsed {
  try {
    const { values, positionals } = parseArgs({
      args,
      options: options ?? {},
      strict: true,
      allowPositionals: true,
    });
    return { values: values as Parsed["values"], positionals };
  } catch (cause) {
    const message = cause instanceof Error ? cause.message : String(cause);
    throw new UsageError(message.split("\n")[0]!.replace(/\.$/, ""), { cause });
  }
}

/**
 * A flag's string value.
 *
 * @param parsed Parse result.
 * @param name The flag.
 * @returns The value, or undefined when absent.
 */
export function stringFlag(parsed: Parsed, name: string): string | undefined {
  const value = parsed.values[name];
  return typeof value === "string" ? value : undefined;
}

/**
 * A positive number flag (seconds, counts, byte sizes).
 *
 * @param parsed Parse result.
 * @param name The flag.
 * @param options Whether zero is allowed, whether it must be an integer, and its largest value.
 * @returns The number, or undefined when absent.
 * @throws {UsageError} When it is not a valid number.
 */
export function numberFlag(
  parsed: Parsed,
  name: string,
  options: { allowZero?: boolean; integer?: boolean; max?: number } = {},
): number | undefined {
  const raw = stringFlag(parsed, name);
  if (raw === undefined) return undefined;
  const value = Number(raw);
  const valid = raw.trim() !== "" && Number.isFinite(value) &&
    (options.allowZero ? value >= 0 : value > 0) && (!options.integer || Number.isInteger(value)) &&
    (options.max === undefined || value <= options.max);
  if (!valid) {
    const bounds = `${options.allowZero ? ">= 0" : "> 0"}${
      options.max === undefined ? "" : ` and <= ${options.max}`
    }`;
    throw new UsageError(
      `Invalid --${name} '${raw}': expected a ${options.integer ? "whole " : ""}number ${bounds}`,
    );
  }
  return value;
}

/**
 * Parses repeated `--env K=V` flags.
 *
 * @param values The raw `K=V` strings.
 * @returns The environment record.
 * @throws {UsageError} When an entry has no `=` or an invalid name.
 */
export function envFlags(values: string[]): Record<string, string> {
  const env: Record<string, string> = {};
  for (const entry of values) {
    const at = entry.indexOf("=");
    const name = at < 0 ? entry : entry.slice(0, at);
    if (at < 0 || !/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) {
      throw new UsageError(`Invalid --env '${entry}': expected NAME=VALUE`);
    }
    env[name] = entry.slice(at + 1);
  }
  return env;
}

/**
 * Refuses positional arguments for a command that takes none.
 *
 * @param positionals The parsed positionals.
 * @throws {UsageError} Naming the first one.
 */
export function noPositionals(positionals: string[]): void {
  if (positionals.length > 0) throw new UsageError(`Unexpected argument '${positionals[0]}'`);
}
