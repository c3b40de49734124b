/**
 * `lib/exit_codes.ts`: the one map of exit statuses holds the numbers the
 * README and the help texts promise. The other tests use the constants; this
 * file is where the numbers themselves are pinned.
 *
 * @module
 */
import assert from "node:assert/strict";
import { EXEC_HELP } from "../lib/cli/exec.ts";
import { MCP_RUN_HELP } from "../lib/cli/mcp_run.ts";
import { SHELL_HELP } from "../lib/cli/shell.ts";
import {
  EXIT_CANCELLED,
  EXIT_CANNOT_EXECUTE,
  EXIT_DISCONNECTED,
  EXIT_FAILURE,
  EXIT_LOCKED,
  EXIT_NOT_FOUND,
  EXIT_RUNNER_FAILED,
  EXIT_SIGNAL_BASE,
  EXIT_TIMEOUT,
  EXIT_WAFFLE,
  exitCodeOfSignal,
} from "../lib/exit_codes.ts";
import { WaffleError } from "../lib/errors.ts";

Deno.test("the exit-code map holds the documented numbers", () => {
  assert.deepEqual(
    {
      EXIT_FAILURE,
      EXIT_RUNNER_FAILED,
      EXIT_LOCKED,
      EXIT_TIMEOUT,
      EXIT_WAFFLE,
      EXIT_CANNOT_EXECUTE,
      EXIT_NOT_FOUND,
      EXIT_SIGNAL_BASE,
      EXIT_CANCELLED,
      EXIT_DISCONNECTED,
    },
    {
      EXIT_FAILURE: 1,
      EXIT_RUNNER_FAILED: 70,
      EXIT_LOCKED: 75,
      EXIT_TIMEOUT: 124,
      EXIT_WAFFLE: 125,
      EXIT_CANNOT_EXECUTE: 126,
      EXIT_NOT_FOUND: 127,
      EXIT_SIGNAL_BASE: 128,
      EXIT_CANCELLED: 130,
      EXIT_DISCONNECTED: 255,
    },
  );
  assert.equal(exitCodeOfSignal(9), 137);
  assert.equal(exitCodeOfSignal(15), 143);
  assert.equal(new WaffleError("Any").exitCode, 125, "a waffle error exits 125 by default");
});

Deno.test("README and the help of exec and mcp run state the map's numbers", async () => {
  const readme = await Deno.readTextFile(new URL("../README.md", import.meta.url));
  const sentence = readme.slice(readme.indexOf("Exit status of `exec`/`wait`:")).split("\n\n")[0]!
    .replaceAll("\n", " ");
  for (
    const phrase of [
      `${EXIT_TIMEOUT} timeout`,
      `${EXIT_WAFFLE} waffle's own error`,
      `${EXIT_CANNOT_EXECUTE} cannot execute`,
      `${EXIT_NOT_FOUND} not found`,
      `${EXIT_SIGNAL_BASE}+n killed by signal n`,
      `${EXIT_CANCELLED} cancelled by Ctrl-C`,
    ]
  ) {
    assert.ok(sentence.includes(phrase), `README lacks '${phrase}': ${sentence}`);
  }
  const execHelp = EXEC_HELP.slice(EXEC_HELP.indexOf("Exit status:")).replaceAll("\n", " ");
  assert.equal(
    execHelp.trim(),
    "Exit status: the command's; 124 timeout; 125 waffle error; 126 cannot execute; " +
      "127 not found; 128+n killed by signal n; 130 cancelled (Ctrl-C)",
  );
  assert.match(SHELL_HELP, /'~\.' ends the session.*waffle exits 255\. '~~' sends one '~'/s);
  assert.match(
    readme,
    /`~\.` ends the session from\s+your side.*`waffle shell` exits \*\*255\*\*/s,
  );
  assert.match(
    MCP_RUN_HELP,
    /1 when the server ended\nfirst .*; 125 when denied .*; 128\+N on signal N/s,
  );
});
