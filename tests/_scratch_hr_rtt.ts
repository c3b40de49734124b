import { openSandbox } from "../lib/lifecycle/sandbox.ts";
import { prepareState } from "../lib/lifecycle/state_dir.ts";
import { DockerClient } from "../lib/docker/mod.ts";
import { removeHomeContainers } from "./_sandbox_helpers.ts";
import { removeHomeVolumes } from "./_hostile_helpers.ts";
const docker = new DockerClient();
const home = await Deno.makeTempDir({ prefix: "waffle-hr-rtt-" });
const s = openSandbox("rtt", { config: { home, idleSeconds: 600 }, docker });
const p50 = (xs: number[]) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)]!.toFixed(1);
try {
  await s.ensure();
  const full: number[] = [], queue: number[] = [], prep: number[] = [], ens: number[] = [];
  for (let i = 0; i < 30; i++) {
    let t = performance.now();
    const id = await s.submit({ shell: "true" });
    await s.queue.wait(id);
    await s.queue.ack(id);
    full.push(performance.now() - t);
    t = performance.now();
    const id2 = await s.queue.submit({ shell: "true" });
    await s.queue.wait(id2);
    await s.queue.ack(id2);
    queue.push(performance.now() - t);
    t = performance.now();
    await prepareState(s.paths, { quotaBytes: s.config.quotaBytes });
    prep.push(performance.now() - t);
    t = performance.now();
    await s.ensure();
    ens.push(performance.now() - t);
  }
  console.log(
    `sandbox.submit+wait p50 ${p50(full)} ms; queue.submit+wait p50 ${
      p50(queue)
    } ms; prepareState p50 ${p50(prep)} ms; ensure (prepareState+ensureContainer) p50 ${
      p50(ens)
    } ms`,
  );
  console.log((await Deno.readTextFile("/proc/self/mountinfo")).split("\n").length, "mount lines");
} finally {
  s.close();
  await removeHomeContainers(docker, home);
  await removeHomeVolumes(home);
  await Deno.remove(home, { recursive: true });
}
