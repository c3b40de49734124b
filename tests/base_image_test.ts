/**
 * The `base` image `waffle serve` starts E2B sandboxes from
 * (`waffle-base:bookworm`, built offline by `scripts/build_images.sh base`):
 * E2B's SDKs run every command as `/bin/bash -l -c "<cmd>"` and expect bash,
 * python3 and `python`, pip, git, curl and a user `user`. Commands run as
 * waffle's uid 10001, which the image names `user`. Needs Docker and the
 * image: registered ignored with the reason when either is missing, failing
 * instead under `WAFFLE_REQUIRE_DOCKER=1`.
 *
 * @module
 */
import assert from "node:assert/strict";
import { openSandbox, removeSandbox, type Sandbox } from "../lib/mod.ts";
import type { DockerClient } from "../lib/docker/mod.ts";
import { dockerGate, liveTest } from "./_docker_gate.ts";
import { run, uniqueUser } from "./_sandbox_helpers.ts";

const BASE = "waffle-base:bookworm";

const gate = await dockerGate();
const imageMissing = gate.client !== undefined && await gate.client.inspectImage(BASE) === null
  ? `image '${BASE}' is missing: run 'bash scripts/build_images.sh base'`
  : undefined;

/** A live test that also needs the base image (see the module doc). */
function baseTest(name: string, fn: (docker: DockerClient) => Promise<void>): void {
  if (imageMissing === undefined) {
    liveTest(name, fn);
  } else if (Deno.env.get("WAFFLE_REQUIRE_DOCKER") === "1") {
    Deno.test({
      name,
      fn: () => {
        throw new Error(`The base image is required (WAFFLE_REQUIRE_DOCKER=1): ${imageMissing}`);
      },
    });
  } else {
    Deno.test({ name: `${name} [ignored: ${imageMissing}]`, ignore: true, fn: () => {} });
  }
}

/** Runs `/bin/bash -l -c line` as E2B's SDKs do; its stdout, or throws with what went wrong. */
async function loginShell(sandbox: Sandbox, line: string): Promise<string> {
  const ran = await run(sandbox, { argv: ["/bin/bash", "-l", "-c", line] });
  assert.equal(
    ran.result.exitCode,
    0,
    `'${line}': ${ran.result.error ?? ""} stdout: ${ran.stdout} stderr: ${ran.stderr}`,
  );
  return ran.stdout;
}

/** Opens a sandbox of `BASE` under a fresh home; purges it and the home after `fn`. */
async function withBaseSandbox(
  docker: DockerClient,
  fn: (sandbox: Sandbox) => Promise<void>,
): Promise<void> {
  const home = await Deno.realPath(await Deno.makeTempDir({ prefix: "waffle-base-" }));
  const sandbox = openSandbox(uniqueUser("base"), { config: { image: BASE, home }, docker });
  try {
    await fn(sandbox);
  } finally {
    sandbox.close();
    try {
      await removeSandbox(docker, sandbox.key, { config: sandbox.config, purge: true });
    } finally {
      await Deno.remove(home, { recursive: true }).catch(() => {});
    }
  }
}

baseTest(
  "the base image runs E2B's login-shell commands as `user` with its tools",
  async (docker) => {
    await withBaseSandbox(docker, async (sandbox) => {
      assert.equal(await loginShell(sandbox, "whoami"), "user\n");
      assert.equal(
        await loginShell(sandbox, "id -u; id -g; id -un; id -gn"),
        "10001\n10001\nuser\nuser\n",
      );
      assert.match(await loginShell(sandbox, "python --version"), /^Python 3\.\d+\.\d+\n$/);
      assert.match(
        await loginShell(sandbox, "python3 -c 'import requests; print(requests.__version__)'"),
        /^\d+\.\d+\.\d+\n$/,
      );
      assert.match(
        await loginShell(sandbox, "pip --version"),
        /^pip \d+\.\d+.* \(python 3\.\d+\)\n$/,
      );
      assert.match(await loginShell(sandbox, "git --version"), /^git version 2\.\d+\.\d+\n$/);
      assert.match(await loginShell(sandbox, "curl --version"), /^curl \d+\.\d+\.\d+ /);
      assert.match(
        await loginShell(sandbox, "ps -o comm= -p $$; less --version"),
        /^bash\nless \d+/,
      );
      assert.equal(await loginShell(sandbox, 'echo "$LANG"'), "C.UTF-8\n");
      assert.equal(
        await loginShell(sandbox, "getent passwd user; readlink /home/user"),
        "user:x:10001:10001:user:/home/user:/bin/bash\n/workspace\n",
      );
      assert.equal(await loginShell(sandbox, "command -v sudo || echo none"), "none\n");
    });
  },
);

baseTest(
  "in the base image the user's home is the workspace: HOME, the working directory and /home/user",
  async (docker) => {
    await withBaseSandbox(docker, async (sandbox) => {
      // The runner's semantics, whatever the image's passwd says: HOME is the
      // workspace, commands start there, and `~` is writable.
      assert.equal(
        await loginShell(sandbox, 'echo "$HOME"; pwd; cd ~ && pwd && touch mine && ls mine'),
        "/workspace\n/workspace\n/workspace\nmine\n",
      );
      // /home/user (E2B's home) is a link to the workspace: the same files.
      assert.equal(
        await loginShell(sandbox, "echo hi > /home/user/x && cat /workspace/x"),
        "hi\n",
      );
      // Anywhere else on the root file system stays read-only.
      const denied = await run(sandbox, { argv: ["/bin/bash", "-l", "-c", "touch /home/x"] });
      assert.equal(denied.result.exitCode, 1);
      assert.match(denied.stderr, /Read-only file system/);
    });
  },
);
