/**
 * Any image works unmodified: a Debian rootfs with python3, pip and git, a
 * musl-only rootfs (no glibc anywhere, standing in for Alpine) and one with
 * no shell at all, each built offline by `scripts/build_images.sh` (which
 * `scripts/test.sh` runs through `setup.sh --images`). waffle brings its own
 * runtime (the runtime kit), runs commands as uid 10001 whatever the image's
 * user table says, and keeps the image's Env and WorkingDir for commands but
 * not for its root runner.
 *
 * @module
 */
import assert from "node:assert/strict";
import { liveTest } from "./_docker_gate.ts";
import { dockerCli, run, tempHome, uniqueUser } from "./_sandbox_helpers.ts";
import type { DockerClient } from "../lib/docker/mod.ts";

const PYTHON = "waffle-python:bookworm";
const MUSL = "waffle-musl:latest";
const NO_SHELL = "waffle-noshell:latest";

async function requireImage(docker: DockerClient, ref: string): Promise<void> {
  if (await docker.inspectImage(ref) === null) {
    throw new Error(`Image '${ref}' is missing: run 'bash scripts/build_images.sh all'`);
  }
}

liveTest("the Debian python image runs python3, pip and git as uid 10001 (CLI)", async (docker) => {
  await requireImage(docker, PYTHON);
  await using home = await tempHome(docker);
  const user = uniqueUser("py");
  const inPython = (...argv: string[]) =>
    home.cli(["exec", "--image", PYTHON, "--user", user, "--", ...argv]);
  const version = await inPython(
    "python3",
    "-c",
    "import sys, os; print(sys.version); print(os.getuid(), os.getgid(), os.getcwd())",
  );
  assert.equal(version.code, 0, version.stderr);
  const [line, ids] = version.stdout.trim().split("\n");
  assert.match(line!, /^3\.\d+\.\d+/);
  assert.equal(ids, "10001 10001 /workspace");
  const git = await inPython(
    "sh",
    "-c",
    "git init -q repo && cd repo && echo hi > f && git add f && " +
      "git -c user.name=a -c user.email=a@b commit -qm one && git log --oneline | wc -l && " +
      "python3 -m pip --version",
  );
  assert.equal(git.code, 0, git.stderr);
  assert.match(git.stdout, /^1\npip \d+/);
});

liveTest("a musl-only image (no glibc) runs its musl programs and a shell", async (docker) => {
  await requireImage(docker, MUSL);
  await using home = await tempHome(docker, { image: MUSL });
  const sandbox = home.open(uniqueUser("musl"));
  const hello = await run(sandbox, { argv: ["musl-hello", "a"] });
  assert.equal(hello.result.exitCode, 0, hello.result.error ?? hello.stderr);
  assert.equal(hello.stdout, "hello from uid 10001 gid 10001 in /workspace a\n");
  // No glibc in the image: only waffle's own kit, outside the image's paths.
  const libs = await run(sandbox, {
    shell: "ls /lib /usr/lib 2>/dev/null; ls /lib64 2>&1; echo $MUSL_IMAGE",
  });
  assert.equal(libs.result.exitCode, 0, libs.stderr);
  assert.match(libs.stdout, /ld-musl-x86_64\.so\.1/);
  assert.doesNotMatch(libs.stdout, /libc\.so\.6|ld-linux/);
  assert.match(libs.stdout, /\n1\n$/, "the image's own ENV reaches commands");
});

liveTest(
  "an image with no shell runs its program in its WorkingDir; its ENTRYPOINT, VOLUME and HEALTHCHECK change nothing",
  async (docker) => {
    await requireImage(docker, NO_SHELL);
    await using home = await tempHome(docker, { image: NO_SHELL });
    const sandbox = home.open(uniqueUser("noshell"));
    const hello = await run(sandbox, { argv: ["/hello", "x"] });
    assert.equal(hello.result.exitCode, 0, hello.result.error ?? hello.stderr);
    // WORKDIR /app; ENTRYPOINT ["/hello", "entrypoint"] is not prefixed.
    assert.equal(hello.stdout, "hello from uid 10001 gid 10001 in /app x\n");
    const inWorkspace = await run(sandbox, { argv: ["/hello"], cwd: "." });
    assert.equal(inWorkspace.stdout, "hello from uid 10001 gid 10001 in /workspace\n");
    const missing = await run(sandbox, { argv: ["sh", "-c", "true"] });
    assert.equal(missing.result.exitCode, 127);
    const container = await docker.inspectContainer(sandbox.key.containerName);
    assert.ok(container !== null);
    // The image's VOLUME is a size-capped tmpfs, not an anonymous volume outside the quota.
    assert.match(container.HostConfig.Tmpfs["/data"] ?? "", /size=\d+/);
    const volumes = await dockerCli(["inspect", "--format", "{{json .Mounts}}", container.Id]);
    assert.doesNotMatch(volumes.stdout, /"Type":"volume"/);
  },
);

liveTest(
  "an image's LD_PRELOAD and DENO_* reach commands but never the root runner",
  async (docker) => {
    await requireImage(docker, MUSL);
    const tag = `waffle-test-env:${crypto.randomUUID().slice(0, 8)}`;
    const base = await dockerCli(["create", MUSL, "/bin/true"]);
    const id = base.stdout.trim();
    try {
      const made = await dockerCli([
        "commit",
        "--change",
        "ENV LD_PRELOAD=/nonexistent/evil.so",
        "--change",
        "ENV DENO_V8_FLAGS=--invalid-flag-from-image",
        "--change",
        "ENV FROM_IMAGE=yes",
        id,
        tag,
      ]);
      assert.equal(made.code, 0, made.stderr);
      await using home = await tempHome(docker, { image: tag });
      const sandbox = home.open(uniqueUser("imgenv"));
      const seen = await run(sandbox, {
        shell: 'echo "$LD_PRELOAD|$DENO_V8_FLAGS|$FROM_IMAGE"',
      });
      assert.equal(seen.result.exitCode, 0, seen.stderr);
      assert.match(seen.stdout, /^\/nonexistent\/evil\.so\|--invalid-flag-from-image\|yes\n/);
      const container = await docker.inspectContainer(sandbox.key.containerName);
      const runnerEnv = await dockerCli([
        "exec",
        container!.Id,
        "sh",
        "-c",
        "tr '\\0' '\\n' < /proc/$(cat /proc/1/task/1/children | cut -d' ' -f1)/environ",
      ]);
      assert.match(runnerEnv.stdout, /^LD_PRELOAD=$/m);
      assert.match(runnerEnv.stdout, /^DENO_V8_FLAGS=--max-semi-space-size=1$/m);
    } finally {
      await dockerCli(["rm", "-f", id]);
      await dockerCli(["rmi", "-f", tag]);
    }
  },
);

liveTest("doctor shows what each image provides, looked at from inside", async (docker) => {
  await using home = await tempHome(docker);
  const expected: [string, RegExp][] = [
    [NO_SHELL, /image provides .*libc none .*has none of sh .*no \/etc\/passwd/],
    [MUSL, /image provides .*libc musl .*has sh\b/],
    [PYTHON, /image provides .*libc glibc .*has sh bash python3 pip3 git curl/],
  ];
  for (const [image, pattern] of expected) {
    await requireImage(docker, image);
    const out = await home.cli(["doctor"], { WAFFLE_IMAGE: image });
    assert.match(out.stdout, pattern, out.stdout + out.stderr);
    assert.match(out.stdout, new RegExp(`runner image .*${image.replace(/[.:]/g, "\\$&")}`));
  }
});
