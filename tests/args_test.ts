/**
 * `lib/cli/args.ts`'s parser against `node:util`'s `parseArgs` (strict, with
 * positionals) on every argument vector of up to three pieces from a list of
 * awkward ones: the same values and positionals where `node:util` accepts
 * them, a one-line `UsageError` where it refuses them.
 *
 * @module
 */
import assert from "node:assert/strict";
import { parseArgs, type ParseArgsConfig } from "node:util";
import { parse } from "../lib/cli/args.ts";
import { UsageError } from "../lib/errors.ts";

const OPTIONS: NonNullable<ParseArgsConfig["options"]> = {
  user: { type: "string" },
  json: { type: "boolean" },
  interactive: { type: "boolean", short: "i" },
  tag: { type: "string", short: "t" },
  env: { type: "string", multiple: true },
};

const PIECES = [
  "--user",
  "u",
  "--user=v",
  "--user=",
  "--json",
  "--json=1",
  "-i",
  "-it",
  "-ti",
  "-tx",
  "-t",
  "-",
  "--",
  "--env",
  "A=1",
  "--env=B=2",
  "--nope",
  "-z",
  "-iz",
  "cmd",
  "--user=-x",
];

Deno.test("args: parse gives node:util parseArgs's results, and refuses what it refuses", () => {
  let accepted = 0;
  let refused = 0;
  const vectors: string[][] = [[]];
  for (const a of PIECES) {
    vectors.push([a]);
    for (const b of PIECES) {
      vectors.push([a, b]);
      for (const c of PIECES) vectors.push([a, b, c]);
    }
  }
  for (const args of vectors) {
    let expected: { values: unknown; positionals: string[] } | undefined;
    try {
      const out = parseArgs({ args, options: OPTIONS, strict: true, allowPositionals: true });
      expected = { values: { ...out.values }, positionals: out.positionals };
    } catch {
      expected = undefined;
    }
    if (expected === undefined) {
      assert.throws(() => parse(args, OPTIONS), (error: unknown) => {
        assert.ok(error instanceof UsageError, String(error));
        assert.doesNotMatch(error.message, /\n|\.$/);
        return true;
      }, JSON.stringify(args));
      refused++;
    } else {
      const got = parse(args, OPTIONS);
      assert.deepEqual(
        { values: got.values, positionals: got.positionals },
        expected,
        JSON.stringify(args),
      );
      accepted++;
    }
  }
  assert.ok(accepted > 1000 && refused > 1000, `${accepted} accepted, ${refused} refused`);
});
