/**
 * `waffle shell` through a real terminal (tmux: a pty the test resizes and
 * types into), and `waffle exec -i` streaming stdin while the command runs.
 *
 * @module
 */
import assert from "node:assert/strict";
import { liveTest } from "./_docker_gate.ts";
import { run, tempHome, uniqueUser } from "./_sandbox_helpers.ts";
import { QueueSession } from "../lib/queue/session.ts";
import { collectOutput } from "../lib/queue/queue.ts";
import { delay, waitFor } from "./_helpers.ts";
import { selfCommand } from "../lib/config/self.ts";
import { onPath } from "../lib/fs.ts";
import { EXIT_WAFFLE } from "../lib/exit_codes.ts";

const PYTHON = "waffle-python:bookworm";

async function tmux(...args: string[]): Promise<string> {
  const out = await new Deno.Command("tmux", { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) throw new Error(`tmux ${args[0]}: ${new TextDecoder().decode(out.stderr)}`);
  return new TextDecoder().decode(out.stdout);
}

// The pane's text, once it contains `pattern`.
async function screenWith(session: string, pattern: RegExp): Promise<string> {
  let screen = "";
  await waitFor(async () => {
    screen = await tmux("capture-pane", "-p", "-t", session);
    return pattern.test(screen);
  }, { timeoutMs: 30_000, what: `the pane to show ${pattern}` }).catch((error) => {
    throw new Error(`${error.message}; the pane shows:\n${screen}`);
  });
  return screen;
}

liveTest(
  "waffle shell runs python3 interactively on a pty: resize seen, Ctrl-C reaches it, exit status and terminal restored",
  async (docker) => {
    assert.ok(onPath("tmux"), "tmux is missing: apt-get install -y tmux");
    await using home = await tempHome(docker, { image: PYTHON });
    const user = uniqueUser("shell");
    const self = selfCommand();
    const status = await Deno.makeTempFile();
    const name = `waffle-test-${crypto.randomUUID().slice(0, 8)}`;
    // The shell runs in the pane; afterwards the pane reports the exit status
    // and whether the terminal is back in cooked mode (echo, icanon).
    const command = [
      `WAFFLE_HOME='${home.home}'`,
      [self.executable, ...self.prefix, "shell", "--user", user, "--", "python3", "-q"]
        .map((word) => `'${word}'`).join(" "),
      `; echo "exit=$? $(stty -a | grep -o -- '-\\?icanon' | head -1)" > '${status}'; sleep 60`,
    ].join(" ");
    await tmux("new-session", "-d", "-s", name, "-x", "100", "-y", "30", command);
    try {
      await screenWith(name, />>>/);
      await tmux(
        "send-keys",
        "-t",
        name,
        "import os, shutil, signal; print('tty', os.isatty(0), tuple(shutil.get_terminal_size()))",
        "Enter",
      );
      await screenWith(name, /tty True \(100, 30\)/);
      await tmux("resize-window", "-t", name, "-x", "120", "-y", "40");
      await delay(500);
      await tmux(
        "send-keys",
        "-t",
        name,
        "print('size', tuple(shutil.get_terminal_size()), os.getpgrp() == os.tcgetpgrp(0))",
        "Enter",
      );
      await screenWith(name, /size \(120, 40\) True/);
      await tmux("send-keys", "-t", name, "import time; time.sleep(60)", "Enter");
      await delay(1000);
      await tmux("send-keys", "-t", name, "C-c");
      await screenWith(name, /KeyboardInterrupt/);
      await tmux("send-keys", "-t", name, "raise SystemExit(7)", "Enter");
      await waitFor(async () => (await Deno.readTextFile(status)).includes("exit="), {
        timeoutMs: 30_000,
        what: "the shell to exit",
      });
      assert.equal((await Deno.readTextFile(status)).trim(), "exit=7 icanon");
    } finally {
      await tmux("kill-session", "-t", name).catch(() => "");
      await Deno.remove(status).catch(() => {});
    }
  },
);

liveTest("waffle shell without a terminal says to use exec -i", async (docker) => {
  await using home = await tempHome(docker);
  const out = await home.cli(["shell", "--user", uniqueUser("notty")]);
  assert.equal(out.code, EXIT_WAFFLE);
  assert.match(out.stderr, /needs a terminal.*exec -i/);
});

liveTest("waffle exec -i streams stdin while the command runs: yes | head -1", async (docker) => {
  await using home = await tempHome(docker);
  const self = selfCommand();
  const child = new Deno.Command("sh", {
    args: [
      "-c",
      `yes | ${[self.executable, ...self.prefix].map((w) => `'${w}'`).join(" ")} exec -i --user ${
        uniqueUser("yes")
      } -- head -1`,
    ],
    env: { WAFFLE_HOME: home.home },
    stdout: "piped",
    stderr: "piped",
  });
  const out = await child.output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  assert.equal(new TextDecoder().decode(out.stdout), "y\n");
});

liveTest(
  "waffle exec -i passes 40 MiB through sha256sum unchanged, more than one request could carry",
  async (docker) => {
    await using home = await tempHome(docker);
    const data = new Uint8Array(40 * 1024 * 1024);
    for (let at = 0; at < data.length; at += 65536) {
      crypto.getRandomValues(data.subarray(at, at + 65536));
    }
    const want = Array.from(new Uint8Array(await crypto.subtle.digest("SHA-256", data)))
      .map((b) => b.toString(16).padStart(2, "0")).join("");
    const self = selfCommand();
    const child = new Deno.Command(self.executable, {
      args: [...self.prefix, "exec", "-i", "--user", uniqueUser("big"), "--", "sha256sum"],
      env: { WAFFLE_HOME: home.home },
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const writer = child.stdin.getWriter();
    await writer.write(data);
    await writer.close();
    const out = await child.output();
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
    assert.equal(new TextDecoder().decode(out.stdout), `${want}  -\n`);
  },
);

liveTest(
  "a command cannot open ptys of its own (the host's shared pty pool), the runner still gives it one",
  async (docker) => {
    await using home = await tempHome(docker);
    const sandbox = home.open(uniqueUser("ptys"));
    const probe = await run(sandbox, {
      shell: "for p in /dev/ptmx /dev/pts/ptmx; do " +
        'if (exec 3<>$p) 2>/dev/null; then echo "$p opened"; else echo "$p refused"; fi; done',
    });
    assert.equal(probe.result.exitCode, 0, probe.stderr);
    assert.equal(probe.stdout, "/dev/ptmx refused\n/dev/pts/ptmx refused\n");
    const session = await QueueSession.open(sandbox, {
      argv: ["sh", "-c", "tty; stty size"],
      tty: { rows: 12, cols: 34 },
      endGraceMs: 0,
    });
    const { result, stdout } = await collectOutput(session.output());
    await session.close();
    assert.equal(result.exitCode, 0);
    assert.match(new TextDecoder().decode(stdout), /^\/dev\/pts\/\d+\r\n12 34\r\n$/);
  },
);
