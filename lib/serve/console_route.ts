/**
 * The console's page at `/ui` (issue 27): `index.html`, `app.js` and
 * `app.css`, built by `scripts/build_console.ts` into
 * `./console/assets.gen.ts` and loaded on first use (a literal dynamic
 * import, so the artefact carries them as a chunk of their own and a run
 * that never serves the console never parses them). Public: every datum the
 * page shows comes from the API, with the key.
 *
 * Every answer carries a strict Content-Security-Policy: scripts only from
 * this origin (and, with Trusted Types required, no string ever becomes
 * code or markup), no frames, no forms, no base, fetches only to this
 * origin.
 *
 * @module
 */

/** An asset of the built console. */
interface ConsoleAsset {
  type: string;
  body: string;
  sha256: string;
}

/**
 * The console's Content-Security-Policy.
 *
 * `style-src` needs `'unsafe-inline'`: xterm 6's DOM renderer (the one the
 * terminal uses) writes its theme, cell size and scrollbar colours into
 * `<style>` elements it creates and rewrites as the font is measured and the
 * terminal resized (so no hash can name them, and xterm has no nonce
 * option), and it colours 24-bit-colour cells with `setAttribute("style")`
 * (so `style-src-attr 'none'` would drop a program's colours; a
 * constructable sheet can stand in for neither). The page itself sets
 * styles through the CSSOM only. Scripts stay `'self'` with Trusted Types
 * required and no policy allowed: CSS cannot run code, and nothing a
 * sandbox sends reaches the page as markup.
 */
export const CONSOLE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data: blob:",
  "connect-src 'self'",
  "font-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
  "require-trusted-types-for 'script'",
  "trusted-types 'none'",
].join("; ");

/** The headers on every answer under /ui. */
const SECURITY_HEADERS: Readonly<Record<string, string>> = {
  "content-security-policy": CONSOLE_CSP,
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "cross-origin-opener-policy": "same-origin",
  "cross-origin-resource-policy": "same-origin",
  "x-frame-options": "DENY",
};

let loading: Promise<Readonly<Record<string, ConsoleAsset>>> | undefined;

// The built assets, once; a failed load is retried on the next request.
function assets(): Promise<Readonly<Record<string, ConsoleAsset>>> {
  loading ??= import("./console/assets.gen.ts").then((module) => module.CONSOLE_ASSETS);
  loading.catch(() => loading = undefined);
  return loading;
}

/**
 * Answers a request for `/ui` or a path under it: `GET`/`HEAD` of `/ui`,
 * `/ui/` (the page) or `/ui/<asset>`; 404 for any other path under /ui, 405
 * for another method, 503 when the console is not built. Assets are
 * revalidated on every load (`no-cache` + their sha256 as `ETag`; a
 * matching `If-None-Match` answers 304).
 *
 * @param request The request.
 * @returns The answer, with the console's security headers.
 */
export async function answerConsole(request: Request): Promise<Response> {
  const path = new URL(request.url).pathname;
  const name = path === "/ui" || path === "/ui/" ? "index.html" : path.slice("/ui/".length);
  if (request.method !== "GET" && request.method !== "HEAD") {
    return failure(405, `Method '${request.method}' is not allowed on the console`, {
      allow: "GET, HEAD",
    });
  }
  let built: Readonly<Record<string, ConsoleAsset>>;
  try {
    built = await assets();
  } catch {
    return failure(503, "The console is not built: run scripts/setup.sh");
  }
  const asset = Object.hasOwn(built, name) ? built[name] : undefined;
  if (asset === undefined) return failure(404, `No console asset '${path.slice(0, 200)}'`);
  const etag = `"${asset.sha256}"`;
  const headers = {
    ...SECURITY_HEADERS,
    "content-type": asset.type,
    "cache-control": "no-cache",
    etag,
  };
  if (matches(request.headers.get("if-none-match"), etag)) {
    return new Response(null, { status: 304, headers });
  }
  return new Response(request.method === "HEAD" ? null : asset.body, { headers });
}

// If-None-Match: a list of entity tags (weak ones compare weakly), or "*".
function matches(header: string | null, etag: string): boolean {
  if (header === null) return false;
  return header.split(",").some((tag) => {
    const trimmed = tag.trim();
    return trimmed === "*" || trimmed.replace(/^W\//, "") === etag;
  });
}

function failure(status: number, message: string, extra: Record<string, string> = {}): Response {
  return Response.json({ code: status, message }, {
    status,
    headers: { ...SECURITY_HEADERS, "cache-control": "no-store", ...extra },
  });
}
