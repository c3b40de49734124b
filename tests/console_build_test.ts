/**
 * The browser console's build and its route (issue 27): the build is
 * idempotent and deterministic, the assets module it writes holds the page,
 * its script and its sheet with matching sha256, `answerConsole` answers
 * them with the console's security headers (the CSP exactly), revalidates
 * by ETag, and refuses any other path or method; no asset names anything
 * outside this origin, the page loads nothing inline, and the SPA's sources
 * never write markup from a string.
 *
 * @module
 */
import assert from "node:assert/strict";
import { answerConsole, CONSOLE_CSP } from "../lib/serve/console_route.ts";
import { CONSOLE_ASSETS, CONSOLE_DIGEST } from "../lib/serve/console/assets.gen.ts";

const REPO = new URL("../", import.meta.url).pathname;
const GENERATED = `${REPO}lib/serve/console/assets.gen.ts`;
const ORIGIN = "http://127.0.0.1:8080";

async function sha256(text: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

async function build(...args: string[]): Promise<string> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-read",
      "--allow-write",
      "--allow-run",
      "--allow-env",
      "scripts/build_console.ts",
      ...args,
    ],
    cwd: REPO,
    env: { DENO_NO_UPDATE_CHECK: "1", NO_COLOR: "1" },
  }).output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  assert.ok(out.success, `build_console.ts failed: ${text}`);
  return text;
}

function get(path: string, init: RequestInit = {}): Promise<Response> {
  return answerConsole(new Request(`${ORIGIN}${path}`, init));
}

function walk(dir: string): string[] {
  const found: string[] = [];
  for (const entry of Deno.readDirSync(dir)) {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory) found.push(...walk(path));
    else if (entry.isFile) found.push(path);
  }
  return found.sort();
}

Deno.test("console build: a second run does nothing, a forced one writes the same bytes", async () => {
  await build();
  const before = await Deno.readTextFile(GENERATED);
  const stat = await Deno.stat(GENERATED);
  assert.match(await build(), /up to date/);
  assert.equal((await Deno.stat(GENERATED)).mtime?.getTime(), stat.mtime?.getTime());
  assert.match(await build("--force"), /built/);
  assert.equal(await Deno.readTextFile(GENERATED), before, "the build is not deterministic");
});

Deno.test("console build: the module holds index.html, app.js and app.css with their sha256", async () => {
  assert.deepEqual(Object.keys(CONSOLE_ASSETS).sort(), ["app.css", "app.js", "index.html"]);
  const digests: string[] = [];
  for (const [name, asset] of Object.entries(CONSOLE_ASSETS)) {
    assert.equal(asset.sha256, await sha256(asset.body), `${name}'s sha256`);
    digests.push(`${name}:${asset.sha256}`);
  }
  assert.equal(CONSOLE_DIGEST, await sha256(digests.join("\n")));
  assert.match(CONSOLE_ASSETS["index.html"]!.type, /^text\/html/);
  assert.match(CONSOLE_ASSETS["app.js"]!.type, /^text\/javascript/);
  assert.match(CONSOLE_ASSETS["app.css"]!.type, /^text\/css/);
  // xterm's and uPlot's sheets are in the one CSS file.
  assert.match(CONSOLE_ASSETS["app.css"]!.body, /\.xterm-helper-textarea/);
  assert.match(CONSOLE_ASSETS["app.css"]!.body, /\.uplot/);
  // The page loads exactly the two assets, and nothing inline.
  const html = CONSOLE_ASSETS["index.html"]!.body;
  const loaded = [...html.matchAll(/\b(?:src|href)="([^"]*)"/g)].map((m) => m[1]).sort();
  assert.deepEqual(loaded, ["/ui/app.css", "/ui/app.js", "data:,"]);
  assert.doesNotMatch(html, /<script(?![^>]*\bsrc=)[^>]*>|<style|\bstyle=|\bon[a-z]+=/i);
});

const EXPECTED_CSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
  "img-src 'self' data: blob:; connect-src 'self'; font-src 'self'; base-uri 'none'; " +
  "form-action 'none'; frame-ancestors 'none'; require-trusted-types-for 'script'; " +
  "trusted-types 'none'";

function assertSecurityHeaders(response: Response, what: string): void {
  const h = response.headers;
  assert.equal(h.get("content-security-policy"), EXPECTED_CSP, what);
  assert.equal(h.get("x-content-type-options"), "nosniff", what);
  assert.equal(h.get("referrer-policy"), "no-referrer", what);
  assert.equal(h.get("x-frame-options"), "DENY", what);
  assert.equal(h.get("cross-origin-opener-policy"), "same-origin", what);
}

Deno.test("console route: the page and its assets, with the security headers and ETags", async () => {
  assert.equal(CONSOLE_CSP, EXPECTED_CSP);
  for (const path of ["/ui", "/ui/", "/ui/index.html"]) {
    const response = await get(path);
    assert.equal(response.status, 200, path);
    assertSecurityHeaders(response, path);
    assert.equal(response.headers.get("cache-control"), "no-cache");
    assert.equal(response.headers.get("etag"), `"${CONSOLE_ASSETS["index.html"]!.sha256}"`);
    assert.equal(await response.text(), CONSOLE_ASSETS["index.html"]!.body);
  }
  for (const name of ["app.js", "app.css"]) {
    const response = await get(`/ui/${name}`);
    assert.equal(response.status, 200);
    assertSecurityHeaders(response, name);
    assert.equal(response.headers.get("content-type"), CONSOLE_ASSETS[name]!.type);
    const etag = response.headers.get("etag");
    assert.equal(etag, `"${CONSOLE_ASSETS[name]!.sha256}"`);
    assert.equal((await response.text()).length, CONSOLE_ASSETS[name]!.body.length);
    const again = await get(`/ui/${name}`, { headers: { "if-none-match": `W/${etag}, "other"` } });
    assert.equal(again.status, 304);
    assertSecurityHeaders(again, `${name} 304`);
    assert.equal(await again.text(), "");
    const changed = await get(`/ui/${name}`, { headers: { "if-none-match": '"other"' } });
    assert.equal(changed.status, 200);
    await changed.body?.cancel();
  }
  const head = await get("/ui/app.js", { method: "HEAD" });
  assert.equal(head.status, 200);
  assert.equal(await head.text(), "");
});

Deno.test("console route: any other path under /ui is 404, any other method 405", async () => {
  for (
    const path of [
      "/ui/nope",
      "/ui/app.js/x",
      "/ui/../ui/app.js.map",
      "/ui/constructor",
      "/ui/__proto__",
      "/ui//app.js",
    ]
  ) {
    const response = await get(path);
    assert.equal(response.status, 404, path);
    assertSecurityHeaders(response, path);
    assert.match((await response.json()).message, /^No console asset '/);
  }
  for (const method of ["POST", "PUT", "DELETE"]) {
    const response = await get("/ui/", { method });
    assert.equal(response.status, 405, method);
    assert.equal(response.headers.get("allow"), "GET, HEAD");
    assertSecurityHeaders(response, method);
    await response.body?.cancel();
  }
});

// URLs in the bundle that name no fetch: XML namespaces (preact's
// createElementNS) and links in xterm's licence comments.
const NOT_FETCHED = new Set([
  "http://www.w3.org/1998/Math/MathML",
  "http://www.w3.org/1999/xhtml",
  "http://www.w3.org/2000/svg",
  "http://www.w3.org/1999/xlink",
  "http://bellard.org/jslinux/",
  "https://github.com/chjj/term.js",
]);

Deno.test("console assets: nothing outside this origin", () => {
  for (const [name, asset] of Object.entries(CONSOLE_ASSETS)) {
    const urls = [...asset.body.matchAll(/\b(?:https?|wss?):\/\/[^\s"'`)<>\\]*/gi)].map((m) =>
      m[0]
    );
    const external = urls.filter((url) => !NOT_FETCHED.has(url));
    assert.deepEqual(external, [], `${name} names an external URL`);
    // Protocol-relative URLs in CSS and HTML fetch from another origin too.
    if (name !== "app.js") {
      assert.doesNotMatch(asset.body, /url\(\s*["']?\/\/|(?:src|href)="\/\//i, name);
      assert.doesNotMatch(asset.body, /@import/i, name);
    }
  }
});

/** The one server file the page may import: the wire types, which import nothing. */
const SHARED_TYPES = "lib/serve/console_types.ts";

Deno.test("console sources: no markup from strings, and imports only ui/, lib/serve/gen/ and the shared wire types", async () => {
  const sources = walk(`${REPO}ui`).filter((path) => /\.(tsx?|html|css)$/.test(path));
  assert.ok(sources.length >= 5, "ui/ has its sources");
  for (const path of sources) {
    const text = await Deno.readTextFile(path);
    const name = path.slice(REPO.length);
    assert.doesNotMatch(
      text,
      /innerHTML|outerHTML|dangerouslySetInnerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function\(/,
      name,
    );
    for (const match of text.matchAll(/(?:\bfrom|\bimport)\s*\(?\s*"([^"]+)"/g)) {
      const target = match[1]!;
      if (!target.startsWith(".")) continue; // a package named in deno.json
      const resolved = new URL(target, `file://${path}`).pathname.slice(REPO.length);
      assert.ok(
        resolved.startsWith("ui/") || resolved.startsWith("lib/serve/gen/") ||
          resolved === SHARED_TYPES,
        `${name} imports '${target}' (${resolved}): ui/ may import only ui/, lib/serve/gen/ and ${SHARED_TYPES}`,
      );
    }
  }
  // The shared types stay types: no import (the page would take server code
  // with it) and nothing but interfaces at run time.
  const shared = await Deno.readTextFile(`${REPO}${SHARED_TYPES}`);
  assert.doesNotMatch(shared, /^\s*import\b|\bfrom\s+"/m, `${SHARED_TYPES} imports nothing`);
  assert.doesNotMatch(
    shared,
    /^export\s+(?!interface\b|type\b)/m,
    `${SHARED_TYPES} exports types only`,
  );
});
