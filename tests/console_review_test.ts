// deno-lint-ignore-file no-explicit-any
/**
 * An independent attacker's review of the console (issue 27), on a real
 * `waffle serve`, the real E2B SDK, Docker and Debian's Chromium.
 *
 * Attacks that hold (regression guards): a tenant's own HTML file, opened
 * through a URL signed with its sandbox's token in the console's own tab
 * (same origin as the page whose sessionStorage holds the admin key), is
 * downloaded, never rendered; a page on another origin that posts forms and
 * `no-cors` fetches at the state-changing routes changes nothing, and gets
 * no CORS grant; the key is never written to serve's logs.
 *
 * Findings (failing until fixed): the envd `/files` answer carries no
 * `nosniff`, `Content-Disposition: attachment` nor sandboxing CSP although
 * its bytes are a sandbox's and it is served on the console's origin; a
 * directory of 60k entries is rendered whole into the files table; a few
 * concurrent `/waffle/v1/egress` calls over a large audit make the server's
 * memory jump by hundreds of MiB; a tenant key named like a CLI tenant
 * (`default`) sees that tenant's CLI sandboxes' audit lines.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Sandbox } from "e2b";
import type { Browser } from "playwright-core";
import { join } from "../lib/path.ts";
import { fileSignature } from "../lib/serve/envd_http.ts";
import { runCliProcess } from "./_helpers.ts";
import { rssOf, sdk, serve, type Served } from "./_serve_helpers.ts";
import { browserTest, launchChromium, signIn, watchPage } from "./_browser.ts";
import { baseTest } from "./_serve_helpers.ts";

const SHOWN_MS = 30_000;

async function adminKey(served: Served, tenant = "ops"): Promise<string> {
  const made = await runCliProcess(["serve", "key", "create", "--tenant", tenant, "--admin"], {
    env: { WAFFLE_HOME: served.home },
  });
  assert.equal(made.code, 0, made.stderr);
  return made.stdout.trim();
}

async function tenantKey(served: Served, tenant: string): Promise<string> {
  const made = await runCliProcess(["serve", "key", "create", "--tenant", tenant], {
    env: { WAFFLE_HOME: served.home },
  });
  assert.equal(made.code, 0, made.stderr);
  return made.stdout.trim();
}

async function withServer(
  options: { captureStderr?: boolean },
  fn: (served: Served) => Promise<void>,
): Promise<void> {
  const served = await serve(options);
  try {
    await fn(served);
  } finally {
    await served.stop();
  }
}

async function withBrowser(fn: (browser: Browser) => Promise<void>): Promise<void> {
  const browser = await launchChromium();
  try {
    await fn(browser);
  } finally {
    await browser.close();
  }
}

async function getJson(served: Served, key: string, path: string): Promise<any> {
  const response = await fetch(`${served.url}${path}`, { headers: { "x-api-key": key } });
  const text = await response.text();
  assert.equal(response.status, 200, `${path}: ${text.slice(0, 200)}`);
  return JSON.parse(text);
}

type Json = any;

/** A signed `GET /files` URL of a sandbox's file, as its key holder can make one. */
async function signedFileUrl(
  served: Served,
  key: string,
  id: string,
  path: string,
): Promise<string> {
  const detail: Json = await getJson(served, key, `/sandboxes/${id}`);
  const signature = fileSignature({
    path,
    operation: "read",
    user: "",
    token: detail.envdAccessToken,
  });
  return `${served.url}/files?path=${encodeURIComponent(path)}&signature=${
    encodeURIComponent(signature)
  }`;
}

// The page a hostile tenant plants: it would send the key in sessionStorage away.
const EVIL_HTML = `<!doctype html><html><head><title>evil</title></head><body>
<script>
  const key = sessionStorage.getItem("waffle.key");
  document.title = "PWNED " + key;
  fetch("/stolen/" + encodeURIComponent(String(key)));
</script><p>hello</p></body></html>`;

browserTest(
  "review: a tenant's HTML file opened by a signed /files URL in the admin's console tab is downloaded, never run; a foreign page's forms and no-cors fetches change nothing; no key in serve's logs",
  async () => {
    await withServer({ captureStderr: true }, async (served) => {
      const admin = await adminKey(served);
      const hostile = await Sandbox.create("base", sdk(served, served.keys.b));
      const id = hostile.sandboxId;
      await hostile.files.write("/home/user/evil.html", EVIL_HTML);
      const url = await signedFileUrl(served, served.keys.b, id, "/home/user/evil.html");
      // The URL works (it is the hostile tenant's to hand out) and gives the bytes.
      const direct = await fetch(url);
      assert.equal(direct.status, 200);
      assert.equal(await direct.text(), EVIL_HTML);

      // A page on another origin: forms and no-cors fetches at every state-changing route.
      const foreign = Deno.serve(
        { hostname: "127.0.0.1", port: 0, onListen: () => {} },
        (request) => foreignAnswer(request, served.url, id),
      );
      try {
        await withBrowser(async (browser) => {
          const context = await browser.newContext({ acceptDownloads: true });
          const page = await context.newPage();
          const watch = await watchPage(page);
          await signIn(page, served.url, admin);
          await page.locator(`tr[data-sandbox-id="${id}"]`).waitFor({ timeout: SHOWN_MS });

          // The operator follows the link in the console's own tab.
          const download = page.waitForEvent("download", { timeout: SHOWN_MS });
          await page.goto(url).catch(() => {});
          const saved = await download;
          assert.equal(saved.url(), url);
          await saved.cancel().catch(() => {});
          const title = String(await page.evaluate("document.title").catch(() => ""));
          assert.ok(!title.includes("PWNED"), `the file ran as a page: ${title}`);

          // The foreign page, in another tab of the same browser.
          const other = await context.newPage();
          const otherWatch = await watchPage(other);
          const port = foreign.addr.port;
          await other.goto(`http://127.0.0.1:${port}/`);
          await other.waitForFunction("document.title === 'sent'", undefined, {
            timeout: SHOWN_MS,
          });
          // Its frames' form posts land (or fail) before the sandbox is looked at.
          await new Promise((resolve) => setTimeout(resolve, 1000));

          const seen = [...watch.requests, ...otherWatch.requests, ...watch.navigations];
          assert.ok(!seen.some((u) => u.includes("/stolen/")), "the planted page ran");
          assert.ok(!seen.some((u) => u.includes(admin)), "the admin key is in a URL");
          assert.deepEqual(await context.cookies(), []);
          await context.close();
        });
      } finally {
        await foreign.shutdown();
      }
      const listed: Json = await getJson(served, admin, "/waffle/v1/sandboxes");
      const row = listed.sandboxes.find((s: Json) => s.sandboxID === id);
      assert.equal(row?.state, "running", "the foreign page paused, stopped or killed it");
      assert.equal((await hostile.commands.run("echo alive")).stdout, "alive\n");

      // No CORS grant, on a preflight nor on an answer.
      for (const path of [`/sandboxes/${id}`, "/waffle/v1/sandboxes", "/files"]) {
        const preflight = await fetch(`${served.url}${path}`, {
          method: "OPTIONS",
          headers: {
            origin: "http://evil.example",
            "access-control-request-method": "DELETE",
            "access-control-request-headers": "x-api-key",
          },
        });
        await preflight.body?.cancel();
        assert.notEqual(preflight.status, 204, path);
        for (const [name] of preflight.headers) {
          assert.ok(!name.startsWith("access-control-allow"), `${path}: ${name}`);
        }
      }

      // The keys in no log line of serve's.
      const audit = await Deno.readTextFile(join(served.home, "serve", "audit.jsonl"));
      assert.ok(audit.length > 0, "serve audited the calls");
      for (const key of [admin, served.keys.a, served.keys.b]) {
        assert.ok(!audit.includes(key.slice(4)), "a key is in serve/audit.jsonl");
        assert.ok(!served.stderr().includes(key.slice(4)), "a key is on serve's stderr");
      }
    });
  },
);

// The foreign site: its page, and a frame of it sandboxed into an opaque origin (`Origin: null`).
function foreignAnswer(request: Request, target: string, id: string): Response {
  const html = { "content-type": "text/html; charset=utf-8" };
  if (new URL(request.url).pathname === "/null") {
    return new Response(
      `<!doctype html><form method="POST" enctype="text/plain" ` +
        `action="${target}/sandboxes/${id}/pause"><input name="x" value="y"></form>` +
        `<script>document.forms[0].submit()</script>`,
      { headers: { ...html, "content-security-policy": "sandbox allow-scripts allow-forms" } },
    );
  }
  return new Response(foreignPage(target, id), { headers: html });
}

function foreignPage(target: string, id: string): string {
  const forms = [
    ["POST", `/sandboxes/${id}/pause`],
    ["POST", `/waffle/v1/sandboxes/${id}/stop`],
    ["POST", `/sandboxes/${id}/snapshots`],
  ].map(([method, path], i) =>
    `<iframe name="f${i}"></iframe><form id="form${i}" target="f${i}" method="${method}" ` +
    `enctype="text/plain" action="${target}${path}"><input name='{"a":"' value='"}'></form>`
  ).join("\n");
  return `<!doctype html><html><head><title>foreign</title></head><body>${forms}
<iframe src="/null"></iframe>
<script>
  (async () => {
    for (const form of document.forms) form.submit();
    const calls = [
      ["DELETE", "/sandboxes/${id}"],
      ["POST", "/sandboxes/${id}/pause"],
      ["POST", "/waffle/v1/sandboxes/${id}/stop"],
      ["POST", "/sandboxes/${id}/timeout"],
    ];
    for (const [method, path] of calls) {
      await fetch("${target}" + path, {
        method, mode: "no-cors", credentials: "include", body: '{"timeout":1}',
        headers: { "content-type": "text/plain" },
      }).catch(() => {});
    }
    document.title = "sent";
  })();
</script></body></html>`;
}

baseTest(
  "review [finding]: envd's GET /files, served on the console's origin, marks the sandbox's bytes as a download that is never sniffed nor run",
  async () => {
    await withServer({}, async (served) => {
      const sandbox = await Sandbox.create("base", sdk(served, served.keys.b));
      await sandbox.files.write("/home/user/evil.html", EVIL_HTML);
      const url = await signedFileUrl(
        served,
        served.keys.b,
        sandbox.sandboxId,
        "/home/user/evil.html",
      );
      for (
        const [how, init] of [
          ["signed URL", {}],
          [
            "token header",
            {
              headers: {
                "e2b-sandbox-id": sandbox.sandboxId,
                "x-access-token": (await getJson(
                  served,
                  served.keys.b,
                  `/sandboxes/${sandbox.sandboxId}`,
                )).envdAccessToken,
              },
            },
          ],
        ] as const
      ) {
        const answer = await fetch(
          how === "signed URL" ? url : `${served.url}/files?path=/home/user/evil.html`,
          init,
        );
        await answer.body?.cancel();
        assert.equal(answer.status, 200, how);
        assert.equal(answer.headers.get("x-content-type-options"), "nosniff", how);
        assert.match(answer.headers.get("content-disposition") ?? "", /^attachment\b/, how);
        assert.match(answer.headers.get("content-security-policy") ?? "", /\bsandbox\b/, how);
      }
    });
  },
);

browserTest(
  "review [finding]: a directory of 60k entries is not rendered whole into the files table",
  async () => {
    await withServer({}, async (served) => {
      const sandbox = await Sandbox.create("base", sdk(served, served.keys.a));
      const made = await sandbox.commands.run(
        "mkdir -p /home/user/big && cd /home/user/big && seq -w 1 60000 | xargs touch && ls | wc -l",
        { timeoutMs: 300_000 },
      );
      assert.equal(made.stdout.trim(), "60000");
      await withBrowser(async (browser) => {
        const context = await browser.newContext();
        const page = await context.newPage();
        await signIn(page, served.url, served.keys.a);
        await page.getByTestId("sandboxes").waitFor({ timeout: SHOWN_MS });
        await page.goto(`${served.url}/ui/#/sandbox/${sandbox.sandboxId}/files`);
        await page.locator('tr[data-name="big"] button').click({ timeout: SHOWN_MS });
        // The listing arrives (or an error says why not). Polled from here:
        // the page's CSP refuses Playwright's string functions.
        const shown = `document.querySelectorAll('[data-testid="files"] tbody tr').length > 0 ||
          document.querySelector('[data-testid="error"]') !== null`;
        for (let i = 0; i < 600 && !await page.evaluate(shown); i++) {
          await new Promise((resolve) => setTimeout(resolve, 200));
        }
        const error = await page.getByTestId("error").textContent({ timeout: 100 }).catch(() =>
          null
        );
        const rows = Number(
          await page.evaluate(`document.querySelectorAll('[data-testid="files"] tbody tr').length`),
        );
        await context.close();
        assert.ok(rows > 0, `no listing: ${error}`);
        assert.ok(rows <= 5000, `the files table holds ${rows} rows`);
      });
    });
  },
);

baseTest(
  "review: concurrent cold /waffle/v1/egress calls over a large audit keep the server's memory bounded (found on 77488eb: +386 MiB)",
  async () => {
    await withServer({}, async (served) => {
      const lines: string[] = [];
      let size = 0;
      for (let i = 0; size < 9 << 20; i++) {
        const line = JSON.stringify({
          time: new Date().toISOString(),
          tenant: "a",
          user: "sbx",
          group: null,
          cron: null,
          server: null,
          method: "CONNECT",
          destination: `d${i % 500}.example`,
          port: 443,
          address: null,
          decision: "denied",
          reason: "x".repeat(200),
          secrets: [],
          bytesUp: 0,
          bytesDown: 0,
          durationMs: 1,
        });
        lines.push(line);
        size += line.length + 1;
      }
      // One call to settle the server's own first-use allocations; the audit is read cold
      // by 24 calls at once.
      await getJson(served, served.keys.a, "/waffle/v1/egress?sandbox=none");
      await Deno.writeTextFile(join(served.home, "egress.jsonl"), lines.join("\n") + "\n");
      const before = await rssOf(served.pid);
      let peak = before;
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          peak = Math.max(peak, await rssOf(served.pid));
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
      })();
      const statuses = await Promise.all(
        Array.from({ length: 24 }, async () => {
          const answer = await fetch(`${served.url}/waffle/v1/egress?q=none`, {
            headers: { "x-api-key": served.keys.a },
          });
          await answer.text();
          return answer.status;
        }),
      );
      // Another tenant is still answered.
      assert.equal((await getJson(served, served.keys.b, "/waffle/v1/whoami")).tenant, "b");
      sampling = false;
      await sampler;
      assert.ok(statuses.every((status) => status === 200 || status === 429), String(statuses));
      const grown = (peak - before) / 2 ** 20;
      assert.ok(grown < 128, `24 concurrent calls grew the server by ${grown.toFixed(0)} MiB`);
    });
  },
);

baseTest(
  "review [finding]: a serve tenant named like the home's CLI tenant sees none of the CLI sandboxes' audit lines",
  async () => {
    await withServer({}, async (served) => {
      const key = await tenantKey(served, "default");
      const time = new Date().toISOString();
      // What the egress proxy and the MCP relay write for `waffle run --user alice` on this home.
      await Deno.writeTextFile(
        join(served.home, "egress.jsonl"),
        JSON.stringify({
          time,
          tenant: "default",
          user: "alice",
          group: "default",
          cron: null,
          server: null,
          method: "CONNECT",
          destination: "alice-private.example",
          port: 443,
          address: null,
          decision: "denied",
          secrets: [],
          bytesUp: 0,
          bytesDown: 0,
          durationMs: 1,
        }) + "\n",
      );
      await Deno.writeTextFile(
        join(served.home, "audit.jsonl"),
        JSON.stringify({
          time,
          user: "alice",
          tenant: "default",
          group: "default",
          cron: null,
          server: "mail",
          from: "client",
          method: "tools/call",
          tool: "read_alice_mail",
          arguments: [],
          durationMs: 1,
          outcome: "ok",
        }) + "\n",
      );
      const egress: Json = await getJson(served, key, "/waffle/v1/egress");
      const mcp: Json = await getJson(served, key, "/waffle/v1/mcp");
      assert.deepEqual(
        egress.entries.map((e: Json) => e.destination),
        [],
        "a serve tenant sees a CLI user's egress",
      );
      assert.deepEqual(mcp.entries.map((e: Json) => e.tool), [], "and its MCP calls");
    });
  },
);

browserTest(
  "review [finding]: after sign-out, the next key signed in in the same tab cannot reach a sandbox the previous key opened",
  async () => {
    await withServer({}, async (served) => {
      const admin = await adminKey(served);
      const victim = await Sandbox.create("base", sdk(served, served.keys.b));
      await victim.files.write("/home/user/b-secret.txt", "b's");
      const filesOf = `${served.url}/ui/#/sandbox/${victim.sandboxId}/files`;
      await withBrowser(async (browser) => {
        const context = await browser.newContext();
        const page = await context.newPage();
        // The operator looks at tenant b's files, then signs out.
        await signIn(page, served.url, admin);
        await page.getByTestId("sandboxes").waitFor({ timeout: SHOWN_MS });
        await page.goto(filesOf);
        await page.locator('tr[data-name="b-secret.txt"]').waitFor({ timeout: SHOWN_MS });
        await page.getByTestId("logout").click();
        await page.locator("#key").waitFor({ timeout: SHOWN_MS });
        // Tenant a signs in in the same tab, and asks for b's sandbox.
        await page.locator("#key").fill(served.keys.a);
        await page.getByTestId("login-submit").click();
        await page.getByTestId("sandboxes").waitFor({ timeout: SHOWN_MS });
        await page.evaluate(`location.hash = "#/sandbox/${victim.sandboxId}/files"`);
        await page.getByTestId("path").waitFor({ timeout: SHOWN_MS });
        // Long enough for the tab's first listing (it polls every 5 s).
        for (let i = 0; i < 25; i++) {
          if (await page.locator('tr[data-name="b-secret.txt"]').count() > 0) break;
          await new Promise((resolve) => setTimeout(resolve, 200));
        }
        const leaked = await page.locator('tr[data-name="b-secret.txt"]').count();
        await context.close();
        assert.equal(leaked, 0, "tenant a's session lists tenant b's files");
      });
    });
  },
);

baseTest(
  "review [finding]: a command's huge argv is kept and answered capped (commands list and the sandboxes table)",
  async () => {
    await withServer({}, async (served) => {
      const sandbox = await Sandbox.create("base", sdk(served, served.keys.b));
      // 120 kB a command, as the SDK sends it (`bash -l -c <cmd>`); Connect allows ~2 MiB.
      const big = "x".repeat(120_000);
      for (let i = 0; i < 20; i++) await sandbox.commands.run(`true ${big}${i}`);
      const answer = await fetch(
        `${served.url}/waffle/v1/sandboxes/${sandbox.sandboxId}/commands?limit=200`,
        { headers: { "x-api-key": served.keys.b } },
      );
      const commands = await answer.text();
      assert.equal(answer.status, 200);
      assert.equal(JSON.parse(commands).commands.length, 20);
      const listed = JSON.stringify(await getJson(served, served.keys.b, "/waffle/v1/sandboxes"));
      assert.ok(listed.length < 16 * 1024, `the sandboxes list is ${listed.length} bytes`);
      assert.ok(
        commands.length < 1024 * 1024,
        `20 commands' answer is ${(commands.length / 2 ** 20).toFixed(1)} MiB`,
      );
    });
  },
);

const MARK = {
  dir: `<img src=x onerror=window.__xss=11>`,
  link: `<svg onload=window.__xss=12>`,
  argv: `<img src=x onerror=window.__xss=13>`,
  snapshot: `<img src=x onerror=window.__xss=14>`,
  tool: `<img src=x onerror=window.__xss=15>`,
  server: `<svg onload=window.__xss=16>`,
  method: `<script>window.__xss=17</script>`,
};

browserTest(
  "review: markup in a directory name, a symlink's target, argv, a snapshot name and MCP tool/server/method runs nothing in any view",
  async () => {
    await withServer({}, async (served) => {
      const sandbox = await Sandbox.create("base", sdk(served, served.keys.a));
      const id = sandbox.sandboxId;
      const quoted = (text: string): string => `'${text.replaceAll("'", `'\\''`)}'`;
      await sandbox.commands.run(
        `mkdir -p /home/user/${quoted(MARK.dir)} && touch /home/user/${
          quoted(MARK.dir)
        }/inner && ` +
          `ln -s ${quoted(MARK.link)} /home/user/link && true ${quoted(MARK.argv)}`,
      );
      const snapshot = await fetch(`${served.url}/sandboxes/${id}/snapshots`, {
        method: "POST",
        headers: { "x-api-key": served.keys.a, "content-type": "application/json" },
        body: JSON.stringify({ name: MARK.snapshot }),
      });
      await snapshot.body?.cancel();
      await Deno.writeTextFile(
        join(served.home, "audit.jsonl"),
        JSON.stringify({
          time: new Date().toISOString(),
          user: id,
          tenant: "a",
          group: "default",
          cron: null,
          server: MARK.server,
          from: "client",
          method: MARK.method,
          tool: MARK.tool,
          arguments: [MARK.tool],
          durationMs: 1,
          outcome: "ok",
        }) + "\n",
      );
      await withBrowser(async (browser) => {
        const context = await browser.newContext();
        const page = await context.newPage();
        const watch = await watchPage(page);
        await signIn(page, served.url, served.keys.a);
        await page.locator(`tr[data-sandbox-id="${id}"]`).waitFor({ timeout: SHOWN_MS });
        const view = async (hash: string, shown: string): Promise<void> => {
          await page.evaluate(`location.hash = ${JSON.stringify(hash)}`);
          await page.getByText(shown).first().waitFor({ timeout: SHOWN_MS });
        };
        await view(`#/sandbox/${id}/commands`, "__xss=13");
        await page.locator("[data-testid=commands] tr[data-command-id]").first().click();
        await view(`#/sandbox/${id}/files`, "__xss=11");
        await page.locator("[data-testid=files] tr").filter({ hasText: "__xss=11" })
          .locator("button").first().click();
        await page.locator('tr[data-name="inner"]').waitFor({ timeout: SHOWN_MS });
        if (snapshot.status < 300) await view(`#/sandbox/${id}/snapshots`, "__xss=14");
        await view(`#/sandbox/${id}/network`, "__xss=15");
        await view("#/audit/mcp", "__xss=16");
        assert.equal(
          await page.locator("[data-testid=mcp] td[data-col=method]").first()
            .textContent(),
          MARK.method,
        );
        assert.equal(await page.evaluate("globalThis.__xss"), undefined);
        assert.deepEqual(watch.dialogs, []);
        assert.deepEqual(watch.errors, []);
        const scripts = (await watch.violations()).filter((v) => /script/.test(v.directive));
        assert.deepEqual(scripts, []);
        await context.close();
      });
    });
  },
);
