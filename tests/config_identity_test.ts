/**
 * Configuration loading, sandbox identity and the posture hash: pure logic,
 * no Docker needed.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { loadConfig, loadWaffleConfig, sandboxToml } from "../lib/config/config.ts";
import { UncoverableVolumeError, UsageError } from "../lib/errors.ts";
import { EXIT_WAFFLE } from "../lib/exit_codes.ts";
import { statePaths } from "../lib/lifecycle/identity.ts";
import { sandboxKey } from "../lib/config/sandbox_key.ts";
import {
  containerSpec,
  imageVolumeMasks,
  LABELS,
  postureHashOf,
  refuseUncoverableVolumes,
  SANDBOX_UID,
  uncoverableVolume,
} from "../lib/lifecycle/posture.ts";
import { removeVolume } from "../lib/lifecycle/quota.ts";
import { prepareState } from "../lib/lifecycle/state_dir.ts";
import type { ContainerCreateBody } from "../lib/docker/mod.ts";

const QUOTA = 16 * 1024 * 1024;

Deno.test("sandboxKey() is deterministic and length-prefixed, so ids never collide", () => {
  const home = { home: "/var/lib/waffle" };
  const a = sandboxKey("ab", "c", home);
  const b = sandboxKey("a", "bc", home);
  assert.notEqual(a.hash, b.hash);
  assert.equal(sandboxKey("ab", "c", home).containerName, a.containerName);
  assert.match(a.containerName, /^waffle-[0-9a-f]{8}-[0-9a-f]{24}$/);
  assert.notEqual(sandboxKey("t1", "alice", home).hash, sandboxKey("t2", "alice", home).hash);
  assert.notEqual(sandboxKey("ab", "c", { home: "/other" }).containerName, a.containerName);
});

Deno.test("sandboxKey() rejects bad tenant and user ids with the value quoted", () => {
  for (
    const [tenant, user] of [["default", ""], ["default", "a/b"], ["x y", "u"], ["t", "-lead"], [
      "t",
      "a".repeat(129),
    ], ["t", "ü"]]
  ) {
    assert.throws(
      () => sandboxKey(tenant!, user!, { home: "/h" }),
      (error: unknown) =>
        error instanceof UsageError && error.message.includes(`'`) && !error.message.endsWith("."),
      `${tenant}/${user}`,
    );
  }
});

Deno.test("loadConfig() layers defaults, waffle.toml and WAFFLE_* variables", async () => {
  const home = await Deno.makeTempDir();
  try {
    assert.equal(loadConfig({ home }).idleSeconds, 1800);
    assert.equal(loadConfig({ home }).pidsLimit, 256);
    assert.equal(loadConfig({ home }).network, "none");
    assert.equal(loadConfig({ home }).mode, "docker");
    assert.equal(loadConfig({ home }).mcpCache, join(home, "mcp-cache"));
    assert.equal(loadConfig({ home }).configPath, undefined);
    await Deno.writeTextFile(
      join(home, "waffle.toml"),
      '[sandbox]\nidle_seconds = 5\npids_limit = 64\nenv = ["LANG"]\nmcp_cache = "/c"\n',
    );
    assert.equal(loadConfig({ home }).idleSeconds, 5);
    assert.deepEqual(loadConfig({ home }).envAllowlist, ["LANG"]);
    assert.equal(loadConfig({ home }).mcpCache, "/c");
    assert.equal(loadConfig({ home }).configPath, join(home, "waffle.toml"));
    Deno.env.set("WAFFLE_PIDS_LIMIT", "99");
    Deno.env.set("WAFFLE_MCP_CACHE", "/env-cache");
    try {
      assert.equal(loadConfig({ home }).pidsLimit, 99);
      assert.equal(loadConfig({ home }).mcpCache, "/env-cache");
      assert.equal(loadConfig({ home, pidsLimit: 50 }).pidsLimit, 50);
    } finally {
      Deno.env.delete("WAFFLE_PIDS_LIMIT");
      Deno.env.delete("WAFFLE_MCP_CACHE");
    }
    // sandboxToml() writes what loadConfig() reads back.
    await Deno.writeTextFile(
      join(home, "waffle.toml"),
      sandboxToml({ idleSeconds: 7, cpus: 1.5, envAllowlist: ["A"], network: "bridge" }),
    );
    const back = loadConfig({ home });
    assert.deepEqual([back.idleSeconds, back.cpus, back.envAllowlist, back.network], [
      7,
      1.5,
      ["A"],
      "bridge",
    ]);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("loadConfig() reads --config FILE, then WAFFLE_CONFIG, then the home's waffle.toml", async () => {
  const home = await Deno.makeTempDir();
  try {
    const other = join(home, "other.toml");
    await Deno.writeTextFile(join(home, "waffle.toml"), "[sandbox]\nidle_seconds = 1\n");
    await Deno.writeTextFile(other, "[sandbox]\nidle_seconds = 2\n");
    await Deno.writeTextFile(join(home, "env.toml"), "[sandbox]\nidle_seconds = 3\n");
    assert.equal(loadConfig({ home }).idleSeconds, 1);
    Deno.env.set("WAFFLE_CONFIG", join(home, "env.toml"));
    try {
      assert.equal(loadConfig({ home }).idleSeconds, 3);
      assert.equal(loadConfig({ home, configPath: other }).idleSeconds, 2);
      assert.equal(
        loadWaffleConfig({ configPath: other, overrides: { home } }).sandbox.idleSeconds,
        2,
      );
    } finally {
      Deno.env.delete("WAFFLE_CONFIG");
    }
    assert.throws(
      () => loadConfig({ home, configPath: join(home, "missing.toml") }),
      /Config file '.*missing.toml' does not exist/,
    );
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("loadConfig() names the bad file, key or variable in one line", async () => {
  const home = await Deno.makeTempDir();
  try {
    const path = join(home, "waffle.toml");
    const fails = (pattern: RegExp): void => {
      assert.throws(
        () => loadConfig({ home }),
        (error: unknown) =>
          error instanceof UsageError && pattern.test(error.message) &&
          !error.message.includes("\n") && error.message.includes(`'${path}'`),
        pattern.source,
      );
    };
    await Deno.writeTextFile(path, "[sandbox]\nimage = \n");
    fails(/is not valid TOML: line 2, column \d+/);
    await Deno.writeTextFile(path, "[sandbox]\npids_limit = 2\n");
    fails(/'sandbox.pids_limit' must be >= 32, found 2/);
    await Deno.writeTextFile(path, '[sandbox]\nidle_seconds = "soon"\n');
    fails(/'sandbox.idle_seconds' must be a number, found "soon"/);
    await Deno.writeTextFile(path, "[sandbox]\nidleSeconds = 5\n");
    fails(/'sandbox.idleSeconds' is not a known key \(expected one of: mode, image, idle_seconds/);
    await Deno.writeTextFile(path, "unknown_key = 1\n");
    fails(/'unknown_key' is not a known key/);
    await Deno.writeTextFile(path, '[sandbox]\nmode = "vm"\n');
    fails(/'sandbox.mode' must be "docker" or "host", found "vm"/);
    await Deno.writeTextFile(path, '[sandbox]\nmcp_cache = "relative"\n');
    fails(/'sandbox.mcp_cache' must be an absolute path, found "relative"/);
    await Deno.writeTextFile(path, '[sandbox]\nrunner = "lib/waffle/waffle.js"\n');
    fails(/'sandbox.runner' must be an absolute path, found "lib\/waffle\/waffle.js"/);
    await Deno.writeTextFile(path, '[sandbox]\nrunner = "/usr/local/bin/waffle"\n');
    fails(
      /'sandbox.runner' must name a bundled artefact \(\*\.js\), found "\/usr\/local\/bin\/waffle"/,
    );
    await Deno.writeTextFile(path, '[sandbox]\nenv = ["OK", "1BAD"]\n');
    fails(/'sandbox.env\[1\]' must be a variable name/);
    await Deno.writeTextFile(path, '[sandbox]\nmode = "host"\n');
    assert.equal(loadConfig({ home }).mode, "host");
    await Deno.remove(path);
    Deno.env.set("WAFFLE_IDLE_SECONDS", "soon");
    try {
      assert.throws(() => loadConfig({ home }), /WAFFLE_IDLE_SECONDS 'soon'/);
    } finally {
      Deno.env.delete("WAFFLE_IDLE_SECONDS");
    }
    assert.throws(() => loadConfig({ home, pidsLimit: 1 }), /Invalid setting 'pidsLimit'/);
    assert.throws(() => loadConfig({ home: "relative/home" }), /absolute/);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("loadConfig() refuses a home with only a legacy config.json", async () => {
  const home = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(join(home, "config.json"), JSON.stringify({ idleSeconds: 5 }));
    assert.throws(
      () => loadConfig({ home }),
      (error: unknown) =>
        error instanceof UsageError && /config\.json' is no longer read/.test(error.message) &&
        /waffle\.toml/.test(error.message) && /snake_case/.test(error.message),
    );
    await Deno.writeTextFile(join(home, "waffle.toml"), "[sandbox]\nidle_seconds = 6\n");
    assert.equal(loadConfig({ home }).idleSeconds, 6);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("containerSpec() covers an image's VOLUMEs with the commands' own tmpfs, or waffle's mount at the same path", async () => {
  const home = await Deno.makeTempDir();
  try {
    const key = sandboxKey("t", "u", { home });
    const paths = statePaths(home, key);
    await prepareState(paths, { quotaBytes: QUOTA });
    const volumes = ["/data/", "/data", "/srv/../var/cache", "/workspace", "/tmp", "/home/sandbox"];
    const spec = containerSpec(key, {
      config: loadConfig({ home }),
      image: { id: "sha256:aa", env: ["LD_PRELOAD=/x.so", "LANG=C"], workingDir: "", volumes },
      paths,
    });
    const tmpfs = spec.body.HostConfig?.Tmpfs ?? {};
    const covered = Object.keys(tmpfs).filter((path) => !["/tmp", "/run/waffle"].includes(path));
    // /workspace is the sandbox's own bind mount, /tmp its own tmpfs: nothing over them.
    assert.deepEqual(covered, ["/data", "/var/cache", "/home/sandbox"]);
    assert.match(tmpfs["/data"]!, /uid=10001,gid=10001,mode=0755/);
    assert.match(tmpfs["/tmp"]!, /^rw,noexec,nosuid,nodev,size=\d+$/);
    assert.equal(spec.body.HostConfig?.Mounts?.filter((m) => m.Target === "/workspace").length, 1);
    // A restricted session's home is its own tmpfs: the VOLUME there is covered by it.
    const restricted = containerSpec(key, {
      config: loadConfig({ home }),
      image: { id: "sha256:aa", env: [], workingDir: "", volumes: ["/home/sandbox"] },
      paths,
      restricted: { id: "r1" },
    });
    assert.match(
      restricted.body.HostConfig?.Tmpfs?.["/home/sandbox"] ?? "",
      /size=64m,.*mode=0700/,
    );
    // The image's variables reach commands through WAFFLE_IMAGE_ENV, the runner sees them empty.
    const env = spec.body.Env ?? [];
    assert.ok(env.includes("LD_PRELOAD=") && env.includes("LANG="));
    assert.ok(env.includes('WAFFLE_IMAGE_ENV=["LD_PRELOAD=/x.so","LANG=C"]'));
    assert.equal(spec.body.Entrypoint?.length, 1);
    assert.deepEqual(spec.body.Healthcheck, { Test: ["NONE"] });
    const preload = spec.body.HostConfig?.Mounts?.find((m) => m.Target === "/etc/ld.so.preload");
    assert.deepEqual(preload, {
      Type: "bind",
      Source: "/dev/null",
      Target: "/etc/ld.so.preload",
      ReadOnly: true,
    });
  } finally {
    await removeVolume(home).catch(() => {});
    await Deno.remove(home, { recursive: true }).catch(() => {});
  }
});

/** Each VOLUME no capped tmpfs can cover, and why (Docker would make it an uncapped volume). */
const UNCOVERABLE: readonly [string, string][] = [
  ["/etc", "a system directory"],
  ["/", "a system directory"],
  ["/usr/", "a system directory"],
  ["/workspace/x", "under waffle's own mount '/workspace'"],
  ["/tmp/cache", "under waffle's own mount '/tmp'"],
  ["/run", "over waffle's own mount '/run/waffle'"],
  ["/home", "over waffle's own mount '/home/sandbox'"],
  ["/queue", "waffle's own directory '/queue'"],
  ["/queue/outbound", "under waffle's own directory '/queue'"],
  ["/opt/./waffle", "waffle's own directory '/opt/waffle'"],
  ["/opt//waffle/rt", "under waffle's own directory '/opt/waffle'"],
  ["/opt", "over waffle's own directory '/opt/waffle'"],
  ["/egress", "waffle's own directory '/egress'"],
  ["/srv/../workspace/y", "under waffle's own mount '/workspace'"],
  ["data", "not an absolute path a tmpfs can be mounted at"],
  ["/a,b", "not an absolute path a tmpfs can be mounted at"],
];

Deno.test("containerSpec() refuses an image with a VOLUME no capped tmpfs can cover: system, over or under waffle's mounts", async () => {
  const home = await Deno.makeTempDir();
  try {
    const key = sandboxKey("t", "u", { home });
    const paths = statePaths(home, key);
    await prepareState(paths, { quotaBytes: QUOTA });
    const config = loadConfig({ home });
    for (const [volume, reason] of UNCOVERABLE) {
      assert.equal(uncoverableVolume(volume), reason, volume);
      for (const restricted of [undefined, { id: "r1" }]) {
        assert.throws(
          () =>
            containerSpec(key, {
              config,
              image: { id: "sha256:aa", env: [], workingDir: "", volumes: ["/data", volume] },
              paths,
              restricted,
            }),
          (error: unknown) =>
            error instanceof UncoverableVolumeError && error.exitCode === EXIT_WAFFLE &&
            error.volume === volume && error.reason === reason &&
            error.message ===
              `Image 'sha256:aa' declares VOLUME '${volume}', which waffle cannot cover with a ` +
                `capped tmpfs (${reason}): rebuild the image without it`,
          volume,
        );
      }
    }
    for (const volume of ["/data", "/var/lib/x", "/etc/app", "/workspace", "/opt/app"]) {
      assert.equal(uncoverableVolume(volume), undefined, volume);
    }
  } finally {
    await removeVolume(home).catch(() => {});
    await Deno.remove(home, { recursive: true }).catch(() => {});
  }
});

Deno.test("imageVolumeMasks() refuses a VOLUME under or over a mount of the container's own, names a control character escaped", () => {
  const image = (volumes: string[]) => ({ id: "img\x1b[2J", volumes });
  assert.deepEqual(
    imageVolumeMasks(image(["/srv/app"]), { sizeBytes: 1, mounted: ["/srv/app"] }),
    {},
  );
  for (const [volume, reason] of [["/srv", "over"], ["/srv/app/x", "under"]] as const) {
    assert.throws(
      () => imageVolumeMasks(image([volume]), { sizeBytes: 1, mounted: ["/srv/app"] }),
      (error: unknown) =>
        error instanceof UncoverableVolumeError &&
        error.reason === `${reason} waffle's own mount '/srv/app'` &&
        error.message.startsWith(`Image 'img\\x1b[2J' declares VOLUME '${volume}'`),
    );
  }
  assert.throws(
    () => refuseUncoverableVolumes("x:1", { volumes: ["/workspace/\n"] }),
    (error: unknown) =>
      error instanceof UncoverableVolumeError && !error.message.includes("\n") &&
      error.message.includes("VOLUME '/workspace/\\x0a'"),
  );
});

Deno.test("containerSpec() posture hash changes with every security setting, not with identity", async () => {
  const home = await Deno.makeTempDir();
  try {
    const key = sandboxKey("t", "u", { home });
    const paths = statePaths(home, key);
    await prepareState(paths, { quotaBytes: QUOTA });
    const config = loadConfig({ home });
    const base = containerSpec(key, {
      config,
      image: { id: "sha256:aa", env: [], workingDir: "", volumes: [] },
      paths,
    });
    assert.equal(base.body.Labels?.[LABELS.posture], base.postureHash);
    assert.equal(base.body.Labels?.[LABELS.image], "sha256:aa");
    assert.equal(base.body.HostConfig?.NetworkMode, "none");
    assert.deepEqual(base.body.HostConfig?.CapDrop, ["ALL"]);
    assert.deepEqual(base.body.HostConfig?.CapAdd, ["SETUID", "SETGID", "KILL"]);
    assert.equal(base.body.User, "0:0");
    assert.ok(base.body.Cmd?.join(" ").includes(`--command-user ${SANDBOX_UID}:${SANDBOX_UID}`));
    assert.equal(base.body.HostConfig?.ReadonlyRootfs, true);
    assert.equal(
      containerSpec(key, {
        config,
        image: { id: "sha256:bb", env: [], workingDir: "", volumes: [] },
        paths,
      }).postureHash,
      base.postureHash,
    );
    for (
      const change of [
        { pidsLimit: 32 },
        { memoryBytes: 64 * 1024 * 1024 },
        { cpus: 2 },
        { network: "bridge" as const },
        { tmpBytes: 2 * 1024 * 1024 },
        { idleSeconds: 7 },
      ]
    ) {
      const other = containerSpec(key, {
        config: { ...config, ...change },
        image: { id: "sha256:aa", env: [], workingDir: "", volumes: [] },
        paths,
      });
      assert.notEqual(other.postureHash, base.postureHash, JSON.stringify(change));
    }
    // The untouched body hashes to the label, so the tweaks below prove each field counts.
    assert.equal(postureHashOf(base.body, paths), base.postureHash);
    // Who it belongs to is no part of it: another user's sandbox (its own
    // labels, hostname, state root and channel directory) has the same
    // posture, which a warm pool's take relies on.
    {
      const other = sandboxKey("t2", "someone-else", { home });
      const otherPaths = statePaths(home, other);
      await prepareState(otherPaths, { quotaBytes: QUOTA });
      Deno.mkdirSync(otherPaths.channel, { recursive: true });
      const spec = containerSpec(other, {
        config,
        image: { id: "sha256:aa", env: [], workingDir: "", volumes: [] },
        paths: otherPaths,
      });
      assert.notEqual(spec.body.Labels?.[LABELS.state], base.body.Labels?.[LABELS.state]);
      assert.notEqual(spec.body.Hostname, base.body.Hostname);
      assert.equal(spec.postureHash, base.postureHash);
      await removeVolume(otherPaths.root);
    }
    // Every field of the create body counts, including ones no list names.
    for (
      const tweak of [
        (b: ContainerCreateBody) => b.HostConfig!.Privileged = true,
        (b: ContainerCreateBody) => b.HostConfig!.RestartPolicy = { Name: "always" },
        (b: ContainerCreateBody) => b.HostConfig!.AutoRemove = true,
        (b: ContainerCreateBody) => b.HostConfig!.MemorySwap = -1,
        (b: ContainerCreateBody) => b.StopTimeout = 1,
        (b: ContainerCreateBody) => b.HostConfig!.Tmpfs = { "/var/tmp": "rw" },
        (b: ContainerCreateBody) => b.HostConfig!.Mounts![0]!.Source = "/etc",
      ]
    ) {
      const body = structuredClone(base.body);
      tweak(body);
      assert.notEqual(postureHashOf(body, paths), base.postureHash, tweak.toString());
    }
  } finally {
    await removeVolume(statePaths(home, sandboxKey("t", "u", { home })).root);
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("prepareState() lays out the state with one writer per directory", async () => {
  const home = await Deno.makeTempDir();
  const paths = statePaths(home, sandboxKey("t", "u", { home }));
  try {
    const volume = await prepareState(paths, { quotaBytes: QUOTA });
    await prepareState(paths, { quotaBytes: QUOTA }); // idempotent
    const mode = (path: string): number => Deno.lstatSync(path).mode! & 0o7777;
    const owner = (path: string): number => Deno.lstatSync(path).uid!;
    assert.equal(mode(paths.root), 0o700);
    // The host's directory: only it (and the runner, the container's root) reads it.
    assert.equal(mode(join(paths.queue, "inbound")), 0o700);
    assert.equal(mode(join(paths.queue, "inbound", "inbound.db")), 0o600);
    // The runner's: uid 0 inside, never the commands' uid.
    assert.equal(mode(paths.outbound), 0o700);
    assert.equal(owner(paths.outbound), 0);
    // The commands': the only directory uid 10001 can write (the runner may only walk in).
    assert.equal(mode(paths.workspace), 0o711);
    assert.equal(owner(paths.workspace), SANDBOX_UID);
    if (volume.enforced) assert.equal(volume.mountPoint, await Deno.realPath(paths.volume));
  } finally {
    await removeVolume(paths.root);
    await Deno.remove(home, { recursive: true });
  }
});

Deno.test("loadConfig() refuses an MCP package cache that overlaps the waffle home", async () => {
  const home = await Deno.makeTempDir();
  try {
    for (const cache of [home, `${home}/sandboxes`, "/"]) {
      await Deno.writeTextFile(join(home, "waffle.toml"), `[sandbox]\nmcp_cache = "${cache}"\n`);
      assert.throws(
        () => loadConfig({ home }),
        (error: unknown) =>
          error instanceof UsageError && error.message.includes(`'sandbox.mcp_cache' '${cache}'`),
        cache,
      );
    }
    await Deno.writeTextFile(
      join(home, "waffle.toml"),
      `[sandbox]\nmcp_cache = "${home}/mcp-cache"\n`,
    );
    assert.equal(loadConfig({ home }).mcpCache, `${home}/mcp-cache`);
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});
