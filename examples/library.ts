/**
 * waffle as a library, from any directory: run a command in a user's
 * sandbox, then stream one. CI runs this file from outside the checkout
 * (tests/library_test.ts).
 *
 * Usage: deno run --allow-all library.ts [USER]
 *
 * @module
 */
// deno-lint-ignore-file no-console
import { openSandbox } from "/usr/local/lib/waffle/mod.js";

const sandbox = openSandbox(Deno.args[0] ?? "alice");
try {
  // One call: the whole result. argv only, no implicit shell: ["sh", "-c", …] for one.
  const hello = await sandbox.run(["sh", "-c", 'echo "hello from $(pwd)"; echo oops >&2; exit 3']);
  console.log(
    JSON.stringify({ exitCode: hello.exitCode, stdout: hello.stdout, stderr: hello.stderr }),
  );

  const counted = await sandbox.run(["wc", "-c"], { stdin: "four", timeoutMs: 10_000 });
  console.log(`wc: ${counted.stdout.trim()}`);

  // Streamed: stdin goes in and output comes back while the command runs.
  const cat = await sandbox.spawn(["cat"]);
  const writer = cat.stdin.getWriter();
  await writer.write(new TextEncoder().encode("streamed\n"));
  const reader = cat.stdout.getReader();
  const first = await reader.read();
  console.log(`cat: ${new TextDecoder().decode(first.value).trim()}`);
  await writer.close();
  reader.releaseLock();
  await cat.stdout.cancel();
  await cat.stderr.cancel();
  const status = await cat.status;
  console.log(`cat exited ${status.exitCode}`);
} finally {
  sandbox.close();
}
