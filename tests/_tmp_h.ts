import { startRunner, tempQueue, delay } from "./_helpers.ts";
import { spawnClient } from "./_stress_client.ts";
await using q = await tempQueue();
const r = await startRunner(q.queueDir, { workspace: q.workspace, concurrency: 4 });
let hot = 0, rolled = 0;
for (let i = 0; i < 30; i++) {
  const child = spawnClient(["writer", q.queueDir, `h${i}`, "4"]);
  let out = "";
  const pump = (async () => { for await (const p of child.stdout.pipeThrough(new TextDecoderStream())) out += p; })();
  while (!out.startsWith("ready\n")) await delay(2);
  await delay(Math.random() * 50);
  child.kill("SIGKILL"); await child.status; await pump;
  const j = () => { try { return Deno.statSync(q.queueDir + "/inbound.db-journal").size; } catch { return -1; } };
  if (j() > 0) {
    hot++;
    const t = Date.now();
    while (j() > 0 && Date.now() - t < 3000) await delay(5);
    if (j() === 0) rolled++;
    console.log("hot journal; after wait", j(), Date.now() - t, "ms");
  }
}
console.log({ hot, rolled });
await r.stop("SIGKILL");
