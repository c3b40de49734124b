/**
 * `scripts/install.sh`, live: the bundled artefact on PATH runs from any
 * directory, the sandbox mounts that same artefact as its runner (not the
 * source tree), and a new build recycles the sandbox on its next use.
 */
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { liveTest } from "./_docker_gate.ts";
import { startUpstream, testCa, writeCaFile } from "./_egress_upstreams.ts";
import { proxyContainerName } from "../lib/egress/proxy_container.ts";
import { tempHome, uniqueUser } from "./_sandbox_helpers.ts";

const INSTALL = fileURLToPath(new URL("../scripts/install.sh", import.meta.url));

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

      // The container runs the installed artefact, mounted read-only; no source tree.
      const [first] = await home.containers();
      assert.ok(first !== undefined);
      const inspected = await docker.inspectContainer(first.Id);
      assert.ok(inspected !== null);
      assert.ok(
        inspected.Config.Cmd.includes("/opt/waffle/waffle.js"),
        inspected.Config.Cmd.join(" "),
      );
      const sources = inspected.HostConfig.Mounts.map((m) => m.Source ?? "");
      assert.ok(sources.includes(`${prefix}/lib/waffle/waffle.js`), sources.join(" "));
      assert.ok(
        !sources.some((source) => source.endsWith("/node_modules") || source.endsWith("/lib")),
      );
      const digest =
        (await Deno.readTextFile(`${prefix}/lib/waffle/waffle.js.sha256`)).split(" ")[0];
      assert.ok(inspected.Config.Env.includes(`WAFFLE_ARTEFACT_SHA256=${digest}`));

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

      // A new build (here: the artefact with one more line) recycles the sandbox.
      await Deno.writeTextFile(`${prefix}/lib/waffle/waffle.js`, "\n// rebuilt\n", {
        append: true,
      });
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
      assert.ok(proxy?.Config.Cmd.includes("/opt/waffle/waffle.js"), proxy?.Config.Cmd.join(" "));
    } finally {
      await Deno.remove(prefix, { recursive: true }).catch(() => {});
    }
  },
);
