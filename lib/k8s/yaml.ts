/**
 * A small YAML emitter for Kubernetes objects (JSON data only): block
 * mappings and sequences, every string double-quoted as JSON quotes it (a
 * JSON string is a valid YAML double-quoted scalar, so no value is ever
 * read back as a number, a boolean or null), a multi-line string as a
 * literal block.
 *
 * @module
 */

/**
 * A YAML stream of documents, each after `---`.
 *
 * @param documents JSON values (objects).
 * @returns The YAML text, ending in a newline.
 *
 * @example
 * ```ts
 * toYamlDocuments([{ kind: "Namespace", metadata: { name: "a" } }]);
 * // '---\nkind: "Namespace"\nmetadata:\n  name: "a"\n'
 * ```
 */
export function toYamlDocuments(documents: readonly unknown[]): string {
  return documents.map((document) => `---\n${toYaml(document)}`).join("");
}

/**
 * One YAML document of a JSON value.
 *
 * @param value A JSON value (no undefined, functions or cycles).
 * @returns The YAML text, ending in a newline.
 */
export function toYaml(value: unknown): string {
  return `${block(value, "").join("\n")}\n`;
}

const PLAIN_KEY = /^[A-Za-z_][A-Za-z0-9_./-]*$/;
const RESERVED = /^(y|n|yes|no|on|off|true|false|null)$/i;

function key(name: string): string {
  return PLAIN_KEY.test(name) && !RESERVED.test(name) ? name : JSON.stringify(name);
}

function scalar(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new RangeError(`Cannot write ${value} as YAML`);
    return String(value);
  }
  if (typeof value === "boolean") return String(value);
  return JSON.stringify(String(value));
}

// A multi-line string as a literal block when it reads back the same:
// a first line neither empty nor indented, no carriage returns or tabs, one final newline.
function literal(text: string, indent: string): string[] | undefined {
  if (!text.endsWith("\n") || text.endsWith("\n\n") || /[\r\t]|[^\n -~]/.test(text)) {
    return undefined;
  }
  const lines = text.slice(0, -1).split("\n");
  if (lines[0] === "" || lines[0]!.startsWith(" ")) return undefined;
  return lines.map((line) => line === "" ? "" : `${indent}${line}`);
}

function isEmpty(value: unknown): boolean {
  return (Array.isArray(value) && value.length === 0) ||
    (typeof value === "object" && value !== null && Object.keys(value).length === 0);
}

// The lines of a value at this indentation (a mapping or a sequence), or one scalar line.
function block(value: unknown, indent: string): string[] {
  if (Array.isArray(value)) {
    if (value.length === 0) return [`${indent}[]`];
    return value.flatMap((item) => entry(`${indent}- `, item, `${indent}  `));
  }
  if (typeof value === "object" && value !== null) {
    const entries = Object.entries(value);
    if (entries.length === 0) return [`${indent}{}`];
    return entries.flatMap(([name, item]) => entry(`${indent}${key(name)}:`, item, `${indent}  `));
  }
  return [`${indent}${scalar(value)}`];
}

// One `key:` or `- ` entry and its value, inline when it is a scalar.
function entry(head: string, value: unknown, inner: string): string[] {
  const sep = head.endsWith(":") ? " " : "";
  if (typeof value === "string" && value.includes("\n")) {
    const lines = literal(value, inner);
    if (lines !== undefined) return [`${head}${sep}|`, ...lines];
  }
  if (typeof value !== "object" || value === null || isEmpty(value)) {
    return [
      `${head}${sep}${isEmpty(value) ? (Array.isArray(value) ? "[]" : "{}") : scalar(value)}`,
    ];
  }
  const lines = block(value, inner);
  if (head.endsWith("- ")) {
    // A sequence item's first line goes beside its dash.
    return [`${head}${lines[0]!.slice(inner.length)}`, ...lines.slice(1)];
  }
  return [head, ...lines];
}
