/**
 * `waffle serve` with a warm pool, through the real E2B SDK: a create from
 * the template takes a ready member, the server refills the pool at once,
 * and `GET /metrics` shows the pool's size.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Sandbox } from "e2b";
import parsePrometheus from "parse-prometheus-text-format";
import { sandboxKey } from "../lib/config/sandbox_key.ts";
import { DockerClient } from "../lib/docker/mod.ts";
import { readyMembers } from "../lib/lifecycle/pool.ts";
import { LABELS } from "../lib/lifecycle/posture.ts";
import { waitFor } from "./_helpers.ts";
import { BASE, sdk, sdkTest } from "./_serve_helpers.ts";

interface Family {
  name: string;
  metrics: { value?: string; labels?: Record<string, string> }[];
}

sdkTest(
  "waffle serve keeps a template's warm pool: Sandbox.create takes a ready member, the pool refills, /metrics shows it",
  async (served) => {
    const ready = () => readyMembers(served.home, "warm").length;
    await waitFor(() => ready() === 2, { timeoutMs: 120_000, what: "the pool to fill" });
    const sandbox = await Sandbox.create("warm", sdk(served, served.keys.a));
    const run = await sandbox.commands.run("echo pooled; ls -A /workspace | wc -l");
    assert.equal(run.stdout, "pooled\n0\n");
    const docker = new DockerClient();
    const name = sandboxKey("a", sandbox.sandboxId, { home: served.home }).containerName;
    const container = await docker.inspectContainer(name);
    assert.equal(container?.Config.Labels[LABELS.pool], "warm", "the create took a member");
    await waitFor(() => ready() === 2, { timeoutMs: 120_000, what: "the pool to refill" });

    const response = await fetch(`${served.url}/metrics`, {
      headers: { "X-API-KEY": served.keys.a },
    });
    assert.equal(response.status, 200);
    const families = parsePrometheus(await response.text()) as Family[];
    const value = (name: string) =>
      families.find((f) => f.name === name)?.metrics.find((m) => m.labels?.template === "warm")
        ?.value;
    assert.equal(value("waffle_pool_ready"), "2");
    assert.equal(value("waffle_pool_capacity"), "2");
    // A template whose sandboxes no member fits (another image) is made cold.
    const cold = await Sandbox.create("other", sdk(served, served.keys.b));
    const coldName = sandboxKey("b", cold.sandboxId, { home: served.home }).containerName;
    assert.equal((await docker.inspectContainer(coldName))?.Config.Labels[LABELS.pool], undefined);
    await sandbox.kill();
    await cold.kill();
  },
  {
    toml: `[templates.warm]\nimage = "${BASE}"\nwarm = 2\n\n` +
      `[templates.other]\nimage = "waffle-runner:latest"\n`,
  },
);
