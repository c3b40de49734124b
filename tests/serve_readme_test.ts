/**
 * The README's E2B snippet ("Use E2B's SDKs with waffle") runs as written,
 * in its own Deno process with only the three variables the README names,
 * against a real `waffle serve` (see tests/_serve_helpers.ts).
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { sdkTest } from "./_serve_helpers.ts";
import { runProcess } from "./_helpers.ts";

const REPO = fileURLToPath(new URL("..", import.meta.url));

/** The first ```js block after the heading. */
async function snippet(): Promise<string> {
  const readme = await Deno.readTextFile(join(REPO, "README.md"));
  const section = readme.slice(readme.indexOf("### Use E2B's SDKs with waffle"));
  const match = /```js\n([\s\S]*?)```/.exec(section);
  assert(match !== null, "no js block in the section");
  return match[1]!;
}

sdkTest("the README's E2B snippet runs as written with the three variables", async (served) => {
  const dir = await Deno.makeTempDir({ prefix: "waffle-readme-" });
  try {
    const file = join(dir, "snippet.mjs");
    await Deno.writeTextFile(file, await snippet());
    const ran = await runProcess(
      Deno.execPath(),
      ["run", "-A", "--config", join(REPO, "deno.json"), file],
      {
        env: {
          E2B_API_KEY: served.keys.a,
          E2B_API_URL: served.url,
          E2B_SANDBOX_URL: served.url,
        },
      },
    );
    assert.equal(ran.code, 0, ran.stderr);
    // What the snippet's comments say it prints.
    assert.equal(ran.stdout, "hi\nuser\n\ndata\n");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
