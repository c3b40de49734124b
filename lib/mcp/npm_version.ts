/**
 * npm versions as a pinned MCP server package needs them: which version npm
 * would install for a tag (`latest`) or a range (`^1`, `1.x`, `>=1 <2`,
 * `1 - 2`, `a || b`), as npm's manifest picker decides: the `latest` tag's
 * version when it satisfies the range, else the highest satisfying one,
 * prereleases only when the range names one of the same
 * `major.minor.patch`. Pure: the registry's answer is passed in. Whether a
 * version is exact is `lib/config/package_pin.ts`'s rule.
 *
 * @module
 */
import { EXACT_VERSION } from "../config/package_pin.ts";

/** A parsed version: numbers and prerelease identifiers (the build is ignored, as npm does). */
interface Version {
  major: number;
  minor: number;
  patch: number;
  prerelease: (string | number)[];
}

/** What a registry says about a package: its versions and dist-tags. */
export interface PackageVersions {
  /** Every published version. */
  versions: string[];
  /** Tags such as `latest`, each naming a version. */
  distTags: Record<string, string>;
}

/**
 * The exact version npm would install for a tag or range, from the
 * registry's versions and dist-tags.
 *
 * @example
 * ```ts
 * import { pickVersion } from "./npm_version.ts";
 * const known = { versions: ["1.0.0", "1.2.0", "2.0.0-rc.1"], distTags: { latest: "1.2.0" } };
 * pickVersion(known, "latest"); // "1.2.0"
 * pickVersion(known, "^1"); // "1.2.0"
 * pickVersion(known, ">=2.0.0-rc.0"); // "2.0.0-rc.1"
 * pickVersion(known, "^3"); // undefined
 * ```
 *
 * @param known The registry's versions and dist-tags.
 * @param wanted A tag, a range, or an exact version ("" means `latest`).
 * @returns The version, or undefined when nothing matches (or the range cannot be read).
 */
export function pickVersion(known: PackageVersions, wanted: string): string | undefined {
  const spec = wanted.trim() === "" ? "latest" : wanted.trim();
  if (Object.hasOwn(known.distTags, spec)) return known.distTags[spec];
  const range = parseRange(spec);
  if (range === undefined) return undefined;
  const latest = Object.hasOwn(known.distTags, "latest") ? known.distTags.latest : undefined;
  if (latest !== undefined && satisfies(latest, range)) return latest;
  let best: { text: string; version: Version } | undefined;
  for (const text of known.versions) {
    const version = parseVersion(text);
    if (version === undefined || !satisfiesParsed(version, range)) continue;
    if (best === undefined || compare(version, best.version) > 0) best = { text, version };
  }
  return best?.text;
}

function parseVersion(text: string): Version | undefined {
  const match = EXACT_VERSION.exec(text.trim().replace(/^[=v]+/, ""));
  if (match === null) return undefined;
  return {
    major: Number(match[1]),
    minor: Number(match[2]),
    patch: Number(match[3]),
    prerelease: match[4] === undefined
      ? []
      : match[4].split(".").map((id) => (/^\d+$/.test(id) ? Number(id) : id)),
  };
}

function compare(a: Version, b: Version): number {
  for (const key of ["major", "minor", "patch"] as const) {
    if (a[key] !== b[key]) return a[key] < b[key] ? -1 : 1;
  }
  // A version without prerelease ranks above the same one with it.
  if (a.prerelease.length === 0 && b.prerelease.length === 0) return 0;
  if (a.prerelease.length === 0) return 1;
  if (b.prerelease.length === 0) return -1;
  for (let i = 0; i < Math.max(a.prerelease.length, b.prerelease.length); i++) {
    const x = a.prerelease[i];
    const y = b.prerelease[i];
    if (x === undefined) return -1;
    if (y === undefined) return 1;
    if (x === y) continue;
    if (typeof x === "number" && typeof y === "number") return x < y ? -1 : 1;
    if (typeof x === "number") return -1;
    if (typeof y === "number") return 1;
    return x < y ? -1 : 1;
  }
  return 0;
}

type Operator = "<" | "<=" | ">" | ">=" | "=";
interface Comparator {
  op: Operator;
  version: Version;
  /** The range's author wrote this prerelease (not one of the `-0` bounds made here). */
  named: boolean;
}
/** Alternatives (`||`), each a set of comparators that must all hold. */
type Range = Comparator[][];

function parseRange(spec: string): Range | undefined {
  const sets: Range = [];
  for (const alternative of spec.split("||")) {
    const set = parseSet(alternative.trim());
    if (set === undefined) return undefined;
    sets.push(set);
  }
  return sets;
}

function parseSet(text: string): Comparator[] | undefined {
  if (text === "" || text === "*" || /^[xX]$/.test(text)) return [];
  const hyphen = /^(\S+)\s+-\s+(\S+)$/.exec(text);
  if (hyphen !== null) {
    const low = partial(hyphen[1]!);
    const high = partial(hyphen[2]!);
    if (low === undefined || high === undefined) return undefined;
    return [...lowerBound(low, ">="), ...upperBound(high)];
  }
  const out: Comparator[] = [];
  // Operators may be followed by spaces: ">= 1.2".
  const tokens = text.replace(/(<=|>=|<|>|=|\^|~>?)\s+/g, "$1").split(/\s+/);
  for (const token of tokens) {
    const match = /^(<=|>=|<|>|=|\^|~>?)?(.*)$/.exec(token)!;
    const version = partial(match[2]!);
    if (version === undefined) return undefined;
    const made = comparators(match[1] ?? "", version);
    if (made === undefined) return undefined;
    out.push(...made);
  }
  return out;
}

/** A version with possibly missing parts: `1`, `1.x`, `1.2.*`. */
interface Partial {
  parts: (number | undefined)[];
  prerelease: (string | number)[];
}

function partial(text: string): Partial | undefined {
  const match =
    /^[=v]*(\d+|[xX*])(?:\.(\d+|[xX*]))?(?:\.(\d+|[xX*]))?(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$/
      .exec(text);
  if (match === null) return undefined;
  const parts = [match[1], match[2], match[3]].map((p) =>
    p === undefined || /^[xX*]$/.test(p) ? undefined : Number(p)
  );
  // "1.x.3" is not a range.
  const firstMissing = parts.indexOf(undefined);
  if (firstMissing >= 0 && parts.slice(firstMissing).some((p) => p !== undefined)) {
    return undefined;
  }
  return {
    parts,
    prerelease: match[4] === undefined
      ? []
      : match[4].split(".").map((id) => (/^\d+$/.test(id) ? Number(id) : id)),
  };
}

// The partial as a comparator's version: missing parts are 0.
function at(op: Operator, p: Partial): Comparator {
  return {
    op,
    version: {
      major: p.parts[0] ?? 0,
      minor: p.parts[1] ?? 0,
      patch: p.parts[2] ?? 0,
      prerelease: p.prerelease,
    },
    named: p.prerelease.length > 0,
  };
}

// Below the first version past the partial's part `index`: 1.2 at 1 -> < 1.3.0-0.
function below(p: Partial, index: number): Comparator {
  const [major = 0, minor = 0, patch = 0] = p.parts;
  const version = index <= 0
    ? { major: major + 1, minor: 0, patch: 0 }
    : index === 1
    ? { major, minor: minor + 1, patch: 0 }
    : { major, minor, patch: patch + 1 };
  return { op: "<", version: { ...version, prerelease: [0] }, named: false };
}

function known(p: Partial): number {
  const missing = p.parts.indexOf(undefined);
  return missing < 0 ? 3 : missing;
}

function lowerBound(p: Partial, op: ">=" | ">"): Comparator[] {
  const parts = known(p);
  if (parts === 0) return [];
  // ">1.2" means ">=1.3.0".
  if (op === ">" && parts < 3) return [{ ...below(p, parts - 1), op: ">=" }];
  return [at(op, p)];
}

function upperBound(p: Partial): Comparator[] {
  const parts = known(p);
  if (parts === 0) return [];
  return parts < 3 ? [below(p, parts - 1)] : [at("<=", p)];
}

function comparators(op: string, p: Partial): Comparator[] | undefined {
  const parts = known(p);
  const [major = 0, minor = 0] = p.parts;
  switch (op) {
    case "":
    case "=":
      return parts === 3 ? [at("=", p)] : [...lowerBound(p, ">="), ...upperBound(p)];
    case ">=":
    case ">":
      return lowerBound(p, op);
    case "<": {
      // "<1.2" is "<1.2.0-0": no prerelease of 1.2.0 either.
      const c = at("<", p);
      return [parts === 3 ? c : { ...c, version: { ...c.version, prerelease: [0] }, named: false }];
    }
    case "<=":
      return upperBound(p);
    case "~":
    case "~>":
      if (parts === 0) return [];
      return [at(">=", p), below(p, parts === 1 ? 0 : 1)];
    case "^":
      if (parts === 0) return [];
      if (major > 0 || parts === 1) return [at(">=", p), below(p, 0)];
      if (minor > 0 || parts === 2) return [at(">=", p), below(p, 1)];
      return [at(">=", p), below(p, 2)];
    default:
      return undefined;
  }
}

function satisfies(text: string, range: Range): boolean {
  const version = parseVersion(text);
  return version !== undefined && satisfiesParsed(version, range);
}

function satisfiesParsed(version: Version, range: Range): boolean {
  return range.some((set) => {
    if (!set.every((c) => holds(version, c))) return false;
    // A prerelease only when the range names one of the same major.minor.patch.
    return version.prerelease.length === 0 ||
      set.some((c) => c.named && sameTriple(c.version, version));
  });
}

function sameTriple(a: Version, b: Version): boolean {
  return a.major === b.major && a.minor === b.minor && a.patch === b.patch;
}

function holds(version: Version, c: Comparator): boolean {
  const order = compare(version, c.version);
  switch (c.op) {
    case "<":
      return order < 0;
    case "<=":
      return order <= 0;
    case ">":
      return order > 0;
    case ">=":
      return order >= 0;
    case "=":
      return order === 0;
  }
}
