/**
 * `lib/path.ts` against `node:path.posix`: every function on every path
 * made of three pieces from a list of awkward ones (empty, `.`, `..`,
 * repeated and trailing slashes, dots inside names, a backslash), and
 * `join`/`resolve` on every pair.
 *
 * @module
 */
import assert from "node:assert/strict";
import { posix } from "node:path";
import { basename, dirname, join, normalize, resolve } from "../lib/path.ts";

const ATOMS = ["", ".", "..", "a", "b", "/", "//", "a/", "/a", "..a", "a..", "...", "a b", "\\x"];

Deno.test("lib/path.ts gives node:path.posix's results", () => {
  const single = { normalize, dirname, basename } as const;
  let compared = 0;
  for (const x of ATOMS) {
    for (const y of ATOMS) {
      for (const z of ATOMS) {
        for (const path of [x + y + z, `${x}/${y}/${z}`]) {
          for (const [name, ours] of Object.entries(single)) {
            assert.equal(ours(path), posix[name as keyof typeof single](path), `${name}(${path})`);
            compared++;
          }
        }
      }
      assert.equal(join(x, y), posix.join(x, y), `join(${x}, ${y})`);
      assert.equal(resolve(x, y), posix.resolve(x, y), `resolve(${x}, ${y})`);
      compared += 2;
    }
  }
  assert.equal(join(), posix.join());
  assert.equal(resolve(), posix.resolve());
  assert.ok(compared > 16_000);
});
