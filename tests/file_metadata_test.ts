/**
 * The rules of files' metadata (`lib/files/metadata.ts`) without a sandbox:
 * what a write may carry, and how the host reads what a sandbox reports
 * (it may lie: every bound is checked again, odd bytes escaped).
 *
 * @module
 */
import assert from "node:assert/strict";
import { FilesError } from "../lib/errors.ts";
import {
  decodeMetadata,
  METADATA_BYTES,
  METADATA_KEY_BYTES,
  metadataProblem,
  reportedSchema,
} from "../lib/files/metadata.ts";

const b64 = (text: string): string => btoa(text);

Deno.test("metadata: a write's keys and values are checked, the offending one quoted", () => {
  assert.equal(metadataProblem({ author: "mish", "a.b-c_d": "" }), undefined);
  assert.match(
    metadataProblem({ "bad key": "v" })!,
    /^Metadata key 'bad key' is not an HTTP token/,
  );
  assert.match(metadataProblem({ "": "v" })!, /^Metadata key '' is not an HTTP token/);
  assert.equal(
    metadataProblem({ good: "bad\nvalue" }),
    "Metadata value 'bad\\nvalue' of key 'good' is not printable US-ASCII",
  );
  assert.match(
    metadataProblem({ ["k".repeat(METADATA_KEY_BYTES + 1)]: "v" })!,
    /^Metadata key 'k{60}…' is over 246 bytes$/,
  );
  assert.equal(metadataProblem({ ["k".repeat(METADATA_KEY_BYTES)]: "v" }), undefined);
  // 9 (prefix) + 1 + 4086 = 4096 fits; one more byte does not.
  assert.equal(metadataProblem({ k: "v".repeat(4086) }), undefined);
  assert.match(metadataProblem({ k: "v".repeat(4087) })!, /^Metadata of 4097 bytes is over 4096/);
});

Deno.test("metadata: what the sandbox reports is bounded and escaped", () => {
  assert.deepEqual(decodeMetadata([[b64("author"), b64("mish <b>")]], "/f"), {
    author: "mish <b>",
  });
  // Not UTF-8, controls, a backslash: each such byte as \xNN.
  assert.deepEqual(decodeMetadata([[b64("k\xff"), b64("\x1b[31m\\")]], "/f"), {
    "k\\xff": "\\x1b[31m\\x5c",
  });
  assert.throws(
    () => decodeMetadata(5000, "/home/user/f"),
    (error: unknown) =>
      error instanceof FilesError &&
      error.message ===
        `The metadata of '/home/user/f' (5000 bytes or more) is over ${METADATA_BYTES} bytes`,
  );
  // A lying report: within each field's size, over the total.
  const pairs: [string, string][] = [[b64("a"), b64("v".repeat(3000))], [
    b64("b"),
    b64("v".repeat(3000)),
  ]];
  assert.ok(reportedSchema.safeParse(pairs).success);
  assert.throws(() => decodeMetadata(pairs, "/f"), /over 4096 bytes/);
  assert.throws(() => decodeMetadata([["not base64!", ""]], "/f"), /is malformed/);
  // Past the schema's bounds: refused before decoding.
  assert.ok(!reportedSchema.safeParse([["a".repeat(400), ""]]).success);
  assert.ok(!reportedSchema.safeParse(Array(500).fill([b64("k"), ""])).success);
  assert.ok(!reportedSchema.safeParse(-1).success);
});
