/**
 * `scripts/install.sh`, live: the bundled artefact on PATH runs from any
 * directory, the sandbox mounts that same build as its runner (not the
 * source tree), a changed build recycles the sandbox on its next use, and a
 * process that runs while a new build is installed finishes on its own.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { liveTest } from "./_docker_gate.ts";
import { startUpstream, testCa, writeCaFile } from "./_egress_upstreams.ts";
import { proxyContainerName } from "../lib/egress/proxy_container.ts";
import { withLock } from "../lib/lifecycle/lock.ts";
import { sha256Hex } from "../lib/digest.ts";
import { tempHome, uniqueUser } from "./_sandbox_helpers.ts";
import { childrenOf } from "../runner/subreaper.ts";

const REPO = fileURLToPath(new URL("../", import.meta.url));
const INSTALL = `${REPO}scripts/install.sh`;

async function sh(
  argv: string[],
  options: { cwd?: string; env?: Record<string, string> } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(argv[0]!, {
    args: argv.slice(1),
    ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
    ...(options.env === undefined ? {} : { env: options.env }),
    stdin: "null",
  }).output();
  const text = (bytes: Uint8Array): string => new TextDecoder().decode(bytes);
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

// The runner of a container: the only child of its init (docker-init).
function runnerPid(initPid: number): number {
  const children = childrenOf(initPid) ?? [];
  assert.equal(children.length, 1, `children of the container's init: ${children.join(" ")}`);
  return children[0]!;
}

// The installed build: its directory (named by `lib/waffle/artefact`) and its digest (of SHA256SUMS).
async function installedBuild(prefix: string): Promise<{ dir: string; digest: string }> {
  const name = (await Deno.readTextFile(`${prefix}/lib/waffle/artefact`)).trim();
  const dir = `${prefix}/lib/waffle/${name}`;
  const digest = sha256Hex(await Deno.readFile(`${dir}/SHA256SUMS`));
  assert.equal(name, `waffle-${digest.slice(0, 12)}`);
  return { dir, digest };
}

// A checkout whose build differs from this one in the module a first ensure
// loads on use (`lib/lifecycle/ensure.ts`, one more statement), so in the
// chunks of that path: copies of `main.ts` (a linked entry would be followed
// back to this checkout's sources) and `lib/`, every other entry a link.
async function changedCheckout(build: string): Promise<string & AsyncDisposable> {
  const dir = await Deno.makeTempDir({ prefix: "waffle-checkout-" });
  // ui/: the install's setup builds the console from it.
  for (
    const entry of ["runner", "scripts", "image", "ui", "deno.json", "deno.lock", "node_modules"]
  ) {
    await Deno.symlink(`${REPO}${entry}`, `${dir}/${entry}`);
  }
  await Deno.symlink(`${REPO}.tools`, `${dir}/.tools`);
  const copied = await sh(["cp", "-R", `${REPO}lib`, `${REPO}main.ts`, dir]);
  assert.equal(copied.code, 0, copied.stderr);
  await Deno.writeTextFile(
    `${dir}/lib/lifecycle/ensure.ts`,
    `\n(globalThis as Record<string, unknown>).waffleTestBuild = "${build}";\n`,
    { append: true },
  );
  return Object.assign(dir, {
    [Symbol.asyncDispose]: () => Deno.remove(dir, { recursive: true }).catch(() => {}),
  }) as string & AsyncDisposable;
}

liveTest(
  "install: waffle on PATH runs from any directory and the sandbox runs that artefact",
  async (docker) => {
    await using home = await tempHome(docker);
    const prefix = await Deno.makeTempDir({ prefix: "waffle-prefix-" });
    try {
      // The bundled artefact even where `deno compile` could fetch its runtime.
      const env = { WAFFLE_INSTALL_BUNDLE: "1" };
      const installed = await sh(["bash", INSTALL, "--prefix", prefix, "--no-docker"], { env });
      assert.equal(installed.code, 0, installed.stderr);
      const again = await sh(["bash", INSTALL, "--prefix", prefix, "--no-docker"], { env });
      assert.equal(again.code, 0, again.stderr);
      assert.match(again.stderr, /artefact unchanged/, "a second install changes nothing");

      // `which waffle` with the prefix on PATH, then a call from "/".
      const path = `${prefix}/bin:/usr/bin:/bin`;
      const which = await sh(["sh", "-c", "command -v waffle"], { env: { PATH: path } });
      assert.equal(which.stdout.trim(), `${prefix}/bin/waffle`);
      const user = uniqueUser("install");
      const callEnv = { PATH: path, WAFFLE_HOME: home.home };
      const ran = await sh(["waffle", "exec", "--user", user, "--", "sh", "-c", "echo hi; pwd"], {
        cwd: "/",
        env: callEnv,
      });
      assert.equal(ran.code, 0, ran.stderr);
      assert.equal(ran.stdout, "hi\n/workspace\n");

      // The container runs the installed build, its directory mounted read-only; no source tree.
      const [first] = await home.containers();
      assert.ok(first !== undefined);
      const inspected = await docker.inspectContainer(first.Id);
      assert.ok(inspected !== null);
      assert.ok(
        inspected.Config.Cmd.includes("/opt/waffle/app/waffle.js"),
        inspected.Config.Cmd.join(" "),
      );
      const build = await installedBuild(prefix);
      const app = inspected.HostConfig.Mounts.find((m) => m.Target === "/opt/waffle/app");
      assert.equal(app?.Source, build.dir);
      assert.equal(app?.ReadOnly, true);
      const sources = inspected.HostConfig.Mounts.map((m) => m.Source ?? "");
      assert.ok(
        !sources.some((source) => source.endsWith("/node_modules") || source.endsWith("/lib")),
      );
      // The digest in the posture covers every file of the build (SHA256SUMS lists them all).
      assert.ok(inspected.Config.Env.includes(`WAFFLE_ARTEFACT_SHA256=${build.digest}`));
      const listed = (await Deno.readTextFile(`${build.dir}/SHA256SUMS`)).trim().split("\n")
        .map((line) => line.split("  ")[1]);
      const files = [...Deno.readDirSync(build.dir)].map((entry) => entry.name)
        .filter((name) => name.endsWith(".js")).sort();
      assert.deepEqual(listed, files);
      assert.ok(files.length > 10, `a split build: ${files.join(" ")}`);
      const checked = await sh(["sha256sum", "--quiet", "-c", "SHA256SUMS"], { cwd: build.dir });
      assert.equal(checked.code, 0, checked.stdout + checked.stderr);

      // The runner cache (made as root) is the runner's DENO_DIR, read-only:
      // the runner cannot write it, and it is the install's, not a sandbox's.
      const cacheMount = inspected.HostConfig.Mounts.find((m) =>
        m.Source === `${prefix}/lib/waffle/runner-cache`
      );
      if (Deno.uid() === 0) {
        assert.ok(cacheMount !== undefined, sources.join(" "));
        assert.equal(cacheMount.ReadOnly, true);
        assert.ok(inspected.Config.Env.includes(`DENO_DIR=${cacheMount.Target}`));
        assert.ok((await Deno.stat(`${prefix}/lib/waffle/runner-cache/v8_code_cache_v2`)).isFile);
        const write = await sh([
          "waffle",
          "exec",
          "--user",
          user,
          "--",
          "sh",
          "-c",
          `touch ${cacheMount.Target}/x`,
        ], {
          cwd: "/",
          env: callEnv,
        });
        assert.notEqual(write.code, 0, "the sandbox cannot write the runner cache");
        // And Deno uses it read-only: one it could not open so is swapped for
        // an empty one in memory, and every container compiles the runner.
        const runner = runnerPid(inspected.State.Pid);
        const open = [...Deno.readDirSync(`/proc/${runner}/fd`)].map((fd) => {
          try {
            return Deno.readLinkSync(`/proc/${runner}/fd/${fd.name}`);
          } catch {
            return "";
          }
        });
        assert.ok(open.includes(`${cacheMount.Target}/v8_code_cache_v2`), open.join(" "));
      }

      // The heartbeat thread (the artefact started as its own worker) keeps beating.
      const queue = home.open(user).queue;
      const before = queue.heartbeat()?.seq ?? -1;
      await new Promise((resolve) => setTimeout(resolve, 4500));
      const beat = queue.heartbeat();
      assert.ok(
        beat !== undefined && beat.seq >= before + 2,
        `heartbeat ${before} -> ${beat?.seq}`,
      );
      assert.equal(queue.liveness().state, "alive");

      // A changed build (here: one chunk with one more line) recycles the sandbox.
      const chunk = files.find((name) => name.startsWith("chunk-"));
      assert.ok(chunk !== undefined);
      await Deno.writeTextFile(`${build.dir}/${chunk}`, "\n// rebuilt\n", { append: true });
      const after = await sh(["waffle", "exec", "--user", user, "--", "true"], {
        cwd: "/",
        env: callEnv,
      });
      assert.equal(after.code, 0, after.stderr);
      const [second] = await home.containers();
      assert.ok(second !== undefined);
      assert.notEqual(second.Id, first.Id, "the container was recreated for the new artefact");

      // The library from source with `runner` = the installed artefact has the
      // CLI's posture: it takes that warm sandbox as it is, without an inspect.
      const library = home.open(user, { config: { runner: `${prefix}/lib/waffle/waffle.js` } });
      await library.ensure();
      assert.equal(library.lastEnsure?.action, "warm");
      assert.equal(library.lastEnsure?.containerId, second.Id);

      // Egress from the installed binary: its proxy runs the same artefact (the
      // CA minting and TLS termination included) and a sandbox reaches a name
      // through it.
      const ca = await testCa();
      await using upstream = await startUpstream({ name: "api.test", ca, hostname: "127.0.0.1" });
      const caFile = await writeCaFile(ca, home.home);
      await Deno.writeTextFile(
        `${home.home}/waffle.toml`,
        `[sandbox]\negress = ["api.test:${upstream.port}"]\negress_addresses = ["127.0.0.1"]\n` +
          `egress_allow_host_loopback = true\n` +
          `[egress]\nextra_ca = "${caFile}"\n[egress.hosts]\n"api.test" = "127.0.0.1"\n`,
      );
      const egress = await sh([
        "waffle",
        "exec",
        "--user",
        uniqueUser("install-egress"),
        "--",
        "/opt/waffle/rt/ld.so",
        "--library-path",
        "/opt/waffle/rt",
        "/opt/waffle/deno",
        "eval",
        `const r = await fetch("https://api.test:${upstream.port}/x"); console.log(r.status)`,
      ], { cwd: "/", env: callEnv });
      assert.equal(egress.code, 0, egress.stderr);
      assert.equal(egress.stdout, "200\n");
      assert.equal(upstream.connections, 1);
      const proxy = await docker.inspectContainer(proxyContainerName(home.home));
      assert.ok(
        proxy?.Config.Cmd.includes("/opt/waffle/app/waffle.js"),
        proxy?.Config.Cmd.join(" "),
      );
      const proxyApp = proxy?.HostConfig.Mounts.find((m) => m.Target === "/opt/waffle/app");
      assert.equal(proxyApp?.Source, build.dir);
      assert.equal(proxyApp?.ReadOnly, true);
    } finally {
      await Deno.remove(prefix, { recursive: true }).catch(() => {});
    }
  },
);

liveTest(
  "install: a waffle exec running while a new build is installed completes from its own build",
  async (docker) => {
    await using home = await tempHome(docker);
    const prefix = await Deno.makeTempDir({ prefix: "waffle-prefix-" });
    const env = { WAFFLE_INSTALL_BUNDLE: "1" };
    const install = (script: string): Promise<{ code: number; stdout: string; stderr: string }> =>
      sh(["bash", script, "--prefix", prefix, "--no-docker"], { env });
    try {
      const first = await install(INSTALL);
      assert.equal(first.code, 0, first.stderr);
      const a = await installedBuild(prefix);
      const user = uniqueUser("upgrade");
      const callEnv = { PATH: `${prefix}/bin:/usr/bin:/bin`, WAFFLE_HOME: home.home };
      // The exec waits for its sandbox's lock, its own modules loaded; the
      // modules of a first ensure (Docker client, container setup) load only
      // after the lock, so after the new build is in place.
      const sandbox = home.open(user);
      const exec = await withLock(sandbox.paths.lock, async () => {
        const child = new Deno.Command("waffle", {
          args: ["exec", "--user", user, "--", "sh", "-c", "sleep 1; echo done"],
          cwd: "/",
          env: { ...callEnv, WAFFLE_TRACE: "1" },
          stdin: "null",
          stdout: "piped",
          stderr: "piped",
        }).spawn();
        const stdout = new Response(child.stdout).text();
        const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
        let seen = "";
        while (!seen.includes("backend open")) {
          const { value, done } = await reader.read();
          assert.ok(!done, `the exec ended before its backend opened: ${seen}`);
          seen += value;
        }
        await using changed = await changedCheckout("b");
        const second = await install(`${changed}/scripts/install.sh`);
        assert.equal(second.code, 0, second.stderr);
        const rest = (async () => {
          for (let next = await reader.read(); !next.done; next = await reader.read()) {
            seen += next.value;
          }
          return seen;
        })();
        return { child, stdout, stderr: rest };
      });
      const b = await installedBuild(prefix);
      assert.notEqual(b.digest, a.digest, "the changed checkout gave another build");
      // Chunks of the first build that the second lacks: a process of the first
      // that loaded them from the second's directory would fail.
      const names = (dir: string): string[] => [...Deno.readDirSync(dir)].map((e) => e.name);
      const gone = names(a.dir).filter((name) => !names(b.dir).includes(name));
      assert.ok(gone.some((name) => name.startsWith("ensure-")), gone.join(" "));
      const status = await exec.child.status;
      const stderr = await exec.stderr;
      assert.equal(status.code, 0, stderr);
      assert.equal(await exec.stdout, "done\n");
      assert.match(stderr, /container ensured \(created\)/);
      assert.ok((await Deno.stat(a.dir)).isDirectory, "the previous build stays");
      assert.match(await Deno.readTextFile(`${prefix}/bin/waffle`), new RegExp(b.dir));
      // It ran on the build it started from: the container it made has build A's digest.
      const [made] = await home.containers();
      assert.ok(made !== undefined);
      const old = await docker.inspectContainer(made.Id);
      assert.ok(old?.Config.Env.includes(`WAFFLE_ARTEFACT_SHA256=${a.digest}`));

      // The next call runs the new build, and recycles the sandbox onto it.
      const next = await sh(["waffle", "exec", "--user", user, "--", "echo", "again"], {
        cwd: "/",
        env: callEnv,
      });
      assert.equal(next.code, 0, next.stderr);
      assert.equal(next.stdout, "again\n");
      const [recycled] = await home.containers();
      assert.ok(recycled !== undefined && recycled.Id !== made.Id);
      const now = await docker.inspectContainer(recycled.Id);
      assert.ok(now?.Config.Env.includes(`WAFFLE_ARTEFACT_SHA256=${b.digest}`));

      // A third build removes the first; the one before it stays.
      await using third = await changedCheckout("c");
      const again = await install(`${third}/scripts/install.sh`);
      assert.equal(again.code, 0, again.stderr);
      const c = await installedBuild(prefix);
      assert.notEqual(c.digest, b.digest);
      await assert.rejects(Deno.stat(a.dir), Deno.errors.NotFound);
      assert.ok((await Deno.stat(b.dir)).isDirectory);
    } finally {
      await Deno.remove(prefix, { recursive: true }).catch(() => {});
    }
  },
);
