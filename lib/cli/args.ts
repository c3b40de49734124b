/**
 * Argument parsing shared by the subcommands: `util.parseArgs`'s strict
 * grammar, with every failure a one-line {@linkcode UsageError}.
 *
 * It is written here rather than imported: Deno's `node:util` (or any of its
 * Node modules but `node:sqlite`) costs ~12 ms of every process start, and
 * the Node project's `@pkgjs/parseargs` as much (it copies every builtin's
 * methods on load), while `waffle exec` starts once per command.
 * `tests/args_test.ts` holds it to `node:util`'s results.
 *
 * @module
 */
import type { ParseArgsConfig } from "node:util";
import { UsageError } from "../errors.ts";
import { isEnvName } from "../env_name.ts";

/** The parsed flags and positionals of one subcommand. */
export interface Parsed {
  values: Record<string, string | boolean | string[] | boolean[] | undefined>;
  positionals: string[];
}

type Options = NonNullable<ParseArgsConfig["options"]>;

/**
 * Parses `args` strictly against `options`, as `util.parseArgs` with
 * `strict: true` and `allowPositionals: true` does: `--name value`,
 * `--name=value`, `-x` (and `-xyz` for booleans, `-xVALUE` for a string),
 * positionals anywhere, everything after `--` positional.
 *
 * @param args The arguments after the subcommand.
 * @param options Option definitions (`type`, `short`, `multiple`).
 * @returns Flags and positionals.
 * @throws {UsageError} On an unknown flag, a missing value or a value given to a boolean.
 */
export function parse(args: string[], options: ParseArgsConfig["options"]): Parsed {
  const specs: Options = options ?? {};
  const shorts = new Map(
    Object.entries(specs).flatMap(([name, spec]) => spec.short ? [[spec.short, name]] : []),
  );
  const values: Parsed["values"] = {};
  const positionals: string[] = [];
  const set = (name: string, value: string | boolean): void => {
    const spec = specs[name]!;
    if (spec.multiple) {
      values[name] = [...(values[name] as (string | boolean)[] ?? []), value] as string[];
    } else values[name] = value;
  };
  const known = (name: string, shown: string): string => {
    if (!Object.hasOwn(specs, name)) {
      throw new UsageError(
        `Unknown option '${shown}'; to pass it to the command, put it after '--'`,
      );
    }
    return name;
  };
  // A string option's value: the next argument, unless that looks like an option.
  const valueFor = (shown: string, at: number): string => {
    const next = args[at];
    if (next === undefined) throw new UsageError(`Option '${shown} <value>' argument missing`);
    if (next.length > 1 && next.startsWith("-")) {
      throw new UsageError(
        `Option '${shown} <value>' argument is ambiguous: give it as '${shown}=${next}'`,
      );
    }
    return next;
  };
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    if (arg === "--") {
      positionals.push(...args.slice(i + 1));
      break;
    }
    if (arg.startsWith("--")) {
      const eq = arg.indexOf("=");
      const name = known(eq < 0 ? arg.slice(2) : arg.slice(2, eq), eq < 0 ? arg : arg.slice(0, eq));
      if (specs[name]!.type === "boolean") {
        if (eq >= 0) throw new UsageError(`Option '--${name}' does not take an argument`);
        set(name, true);
      } else set(name, eq >= 0 ? arg.slice(eq + 1) : valueFor(`--${name}`, ++i));
    } else if (arg.startsWith("-") && arg !== "-") {
      for (let j = 1; j < arg.length; j++) {
        const name = known(shorts.get(arg[j]!) ?? "", `-${arg[j]}`);
        if (specs[name]!.type === "boolean") {
          set(name, true);
          continue;
        }
        // `-xVALUE`, or `-x VALUE` when the flag ends the group.
        const shown = `-${arg[j]}, --${name}`;
        set(name, j + 1 < arg.length ? arg.slice(j + 1) : valueFor(shown, ++i));
        break;
      }
    } else positionals.push(arg);
  }
  return { values, positionals };
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
    if (at < 0 || !isEnvName(name)) {
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
