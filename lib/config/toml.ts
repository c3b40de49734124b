/**
 * Reading `waffle.toml`: TOML syntax errors and schema issues turned into one
 * line naming the file, the key path, what was expected and what was found.
 *
 * @module
 */
import { parse, TomlError } from "npm:smol-toml@1.9.1";
import type * as z from "../schema.ts";
import { UsageError } from "../errors.ts";

/** A config problem at one key: `'<key>' <detail>` once the file is named. */
export interface ConfigProblem {
  /** Dotted key path, e.g. `mcp.everything.execution`. */
  key: string;
  /** What was expected and what was found, e.g. `must be "host", found "sandbox"`. */
  detail: string;
  /** Set when the problem is a `package` without an exact version: its name and what was asked. */
  unpinned?: { packageName: string; requested: string } | undefined;
}

/**
 * Parses a TOML document.
 *
 * @example
 * ```ts ignore
 * const table = parseToml("[sandbox]\nimage = \"x\"\n", "/h/waffle.toml");
 * ```
 *
 * @param text The document.
 * @param path The file it came from (for the message).
 * @returns The root table.
 * @throws {UsageError} On a syntax error: one line with the file, line and column.
 */
export function parseToml(text: string, path: string): Record<string, unknown> {
  try {
    return parse(text) as Record<string, unknown>;
  } catch (cause) {
    if (cause instanceof TomlError) {
      const what = (cause.message.split("\n")[0] ?? "").replace(/^Invalid TOML document: /, "");
      throw new UsageError(
        `Config file '${path}' is not valid TOML: line ${cause.line}, column ${cause.column}: ${what}`,
        { cause },
      );
    }
    throw new UsageError(`Config file '${path}' is not valid TOML: ${String(cause)}`, { cause });
  }
}

/**
 * Formats a key path the way users write it: `mcp.everything.env[0]`.
 *
 * @param path Segments.
 * @returns The dotted key.
 */
export function keyPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const segment of path) {
    if (typeof segment === "number") out += `[${segment}]`;
    else out += out === "" ? String(segment) : `.${String(segment)}`;
  }
  return out;
}

/**
 * Describes a value the way the config error shows it.
 *
 * @param value A TOML value (or undefined when absent).
 * @returns `"text"`, `5`, `true`, `a table`, `nothing`...
 */
export function describeFound(value: unknown): string {
  if (value === undefined) return "nothing";
  if (typeof value === "string") return clip(JSON.stringify(value));
  if (typeof value === "number" || typeof value === "boolean" || typeof value === "bigint") {
    return String(value);
  }
  if (value instanceof Date) return "a date";
  if (Array.isArray(value)) {
    const json = JSON.stringify(value);
    return json === undefined || json.length > 60 ? "an array" : json;
  }
  return "a table";
}

function clip(text: string): string {
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

const TYPE_NAMES: Record<string, string> = {
  object: "a table",
  record: "a table",
  array: "an array",
  string: "a string",
  number: "a number",
  int: "an integer",
  boolean: "true or false",
};

/**
 * Turns the first zod issue into a problem at a key.
 *
 * @param issue The zod issue.
 * @param root The parsed document (to show what was found).
 * @param options Key prefix and the known keys of tables (for unknown keys).
 * @returns The key and the detail.
 */
export function issueProblem(
  issue: z.core.$ZodIssue,
  root: unknown,
  options: {
    prefix?: readonly PropertyKey[];
    knownKeys?: (path: readonly PropertyKey[]) => string[];
  } = {},
): ConfigProblem {
  const path = [...(options.prefix ?? []), ...issue.path];
  const found = describeFound(valueAt(root, path));
  switch (issue.code) {
    case "invalid_union": {
      // The alternative the value came closest to: one that failed deeper
      // than on the value's own type. When every one failed on the type,
      // say which types would do.
      const deeper = issue.errors.filter((issues) =>
        !issues.every((inner) => inner.code === "invalid_type" && inner.path.length === 0)
      );
      if (deeper.length === 1 && deeper[0]!.length > 0) {
        return issueProblem(deeper[0]![0]!, root, { ...options, prefix: path });
      }
      const expected = [
        ...new Set(
          issue.errors.flatMap((issues) =>
            issues.flatMap((inner) =>
              inner.code === "invalid_type" && inner.path.length === 0
                ? [TYPE_NAMES[inner.expected] ?? inner.expected]
                : []
            )
          ),
        ),
      ];
      return {
        key: keyPath(path),
        detail: `must be ${expected.length > 0 ? expected.join(" or ") : "valid"}, found ${found}`,
      };
    }
    case "invalid_key": {
      const inner = issue.issues[0];
      const rule = inner === undefined ? "is not a valid name" : `name ${inner.message}`;
      return {
        key: keyPath(path),
        detail: `${rule}, found ${describeFound(String(path.at(-1) ?? ""))}`,
      };
    }
    case "unrecognized_keys": {
      const known = options.knownKeys?.(path) ?? [];
      return {
        key: keyPath([...path, issue.keys[0] ?? "?"]),
        detail: `is not a known key${
          known.length === 0 ? "" : ` (expected one of: ${known.join(", ")})`
        }`,
      };
    }
    case "invalid_type":
      return {
        key: keyPath(path),
        detail: `must be ${TYPE_NAMES[issue.expected] ?? issue.expected}, found ${found}`,
      };
    case "invalid_value":
      return {
        key: keyPath(path),
        detail: `must be ${
          issue.values.map((v) => JSON.stringify(v)).join(" or ")
        }, found ${found}`,
      };
    case "too_small":
    case "too_big": {
      const bound = Number(issue.code === "too_small" ? issue.minimum : issue.maximum);
      const op = issue.code === "too_small" ? (issue.inclusive === false ? ">" : ">=") : (
        issue.inclusive === false ? "<" : "<="
      );
      const expected = issue.origin === "string"
        ? (bound === 1 && op === ">=" ? "must not be empty" : `must have ${op} ${bound} characters`)
        : issue.origin === "array"
        ? `must have ${op} ${bound} entries`
        : `must be ${op} ${bound}`;
      return { key: keyPath(path), detail: `${expected}, found ${found}` };
    }
    default:
      return { key: keyPath(path), detail: `${issue.message}, found ${found}` };
  }
}

function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let at: unknown = root;
  for (const segment of path) {
    if (at === null || typeof at !== "object" || !Object.hasOwn(at, segment)) return undefined;
    at = (at as Record<PropertyKey, unknown>)[segment];
  }
  return at;
}
