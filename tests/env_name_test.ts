/**
 * `lib/env_name.ts`: one rule for environment variable names. Every place a
 * name enters (`--env`, a request's payload, the runner's check before it
 * spawns, the config's `[sandbox] env` and an MCP server's `env`) accepts
 * and refuses exactly the names the rule does.
 *
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { envFlags } from "../lib/cli/args.ts";
import { loadWaffleConfig } from "../lib/config/config.ts";
import { isEnvName } from "../lib/env_name.ts";
import { UsageError } from "../lib/errors.ts";
import { execPayloadSchema } from "../lib/queue/protocol.ts";
import { buildEnv } from "../runner/workspace.ts";

const NAMES = [
  "HOME",
  "_",
  "_x1",
  "a_B9",
  "1X",
  "9",
  "",
  "A-B",
  "A.B",
  "A B",
  "A=B",
  "É",
  "A\nB",
  "A\0B",
];

function accepts(what: string, fn: () => unknown): boolean {
  try {
    fn();
    return true;
  } catch (error) {
    assert.ok(error instanceof UsageError, `${what}: ${error}`);
    return false;
  }
}

Deno.test("the env-name rule accepts letters, digits and '_' not starting with a digit", () => {
  assert.deepEqual(NAMES.filter(isEnvName), ["HOME", "_", "_x1", "a_B9"]);
});

Deno.test("every entry point for a variable name follows the one rule", async () => {
  const home = await Deno.makeTempDir({ prefix: "waffle-env-name-" });
  try {
    const file = join(home, "waffle.toml");
    for (const name of NAMES) {
      const expected = isEnvName(name);
      const shown = JSON.stringify(name);
      // `--env A=B=v` is name A, value B=v: a name with '=' cannot be written there.
      if (!name.includes("=")) {
        assert.equal(accepts("--env", () => envFlags([`${name}=v`])), expected, `--env ${shown}`);
      }
      const payload = execPayloadSchema.safeParse({ argv: ["true"], env: { [name]: "v" } });
      assert.equal(payload.success, expected, `payload env ${shown}`);
      const extra = Object.fromEntries([[name, "v"]]);
      assert.equal(
        accepts("buildEnv", () => buildEnv({}, { extra, requestId: "r1" })),
        expected,
        `runner env ${shown}`,
      );
      for (
        const toml of [
          `[sandbox]\nenv = [${JSON.stringify(name)}]\n`,
          `[mcp.s]\ncommand = "/bin/true"\nexecution = "host"\nauthority = "host"\nenv = [${
            JSON.stringify(name)
          }]\n`,
        ]
      ) {
        await Deno.writeTextFile(file, toml);
        const loaded = accepts(
          "config",
          () => loadWaffleConfig({ configPath: file, overrides: { home } }),
        );
        assert.equal(loaded, expected, `${toml.split("\n")[0]} env ${shown}`);
      }
    }
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});
