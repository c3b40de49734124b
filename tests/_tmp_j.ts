import { Queue } from "../lib/queue/queue.ts";
import { startRunner, tempQueue, delay } from "./_helpers.ts";
let hot = 0;
for (let i = 0; i < 10; i++) {
  await using q = await tempQueue();
  const r = await startRunner(q.queueDir, { workspace: q.workspace });
  const queue = Queue.open(q.queueDir);
  await queue.submit({ shell: "yes xxxxxxxxxxxxxxxxxxxxxx | head -c 60000000", outputCap: 64 * 1024 * 1024 });
  await delay(300 + Math.random() * 300);
  await r.stop("SIGKILL");
  let s = 0; try { s = Deno.statSync(q.queueDir + "/outbound.db-journal").size; } catch { s = -1; }
  console.log("journal", s, "db", Deno.statSync(q.queueDir + "/outbound.db").size);
  if (s > 0) hot++;
  queue.close();
}
console.log("hot", hot);
