/**
 * injectSecrets() (lib/egress/inject.ts): a placeholder becomes its
 * secret's value in the secret's header, for the secret's hosts, in a
 * request that names the connection's authority, and nowhere else.
 *
 * @module
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { type HeldSecret, injectSecrets } from "../lib/egress/inject.ts";
import type { RequestHead } from "../lib/egress/http_head.ts";
import { TEST_PLACEHOLDER, TEST_SECRET } from "./_egress_proxy.ts";

const PLACEHOLDER = TEST_PLACEHOLDER;
const GH: HeldSecret = TEST_SECRET;
const NPM: HeldSecret = {
  name: "npm",
  hosts: ["secret.test", "npm.test"],
  header: "X-Npm-Token",
  format: "{}",
  placeholder: "waffle_npm_fedcba9876543210fedcba98",
  value: "npm-value",
};

/** The authority of a tunnel to secret.test on 443. */
const SECRET_TEST = { host: "secret.test", port: 443 };

function request(headers: [string, string][], target = "/"): RequestHead {
  return { method: "GET", target, version: "HTTP/1.1", headers };
}

function basic(credential: string): string {
  return `Basic ${Buffer.from(credential).toString("base64")}`;
}

// A request to `host` on port 443 (its Host header first, left out of the result).
function inject(
  headers: [string, string][],
  options: { host?: string; secrets?: HeldSecret[]; target?: string } = {},
): { headers: [string, string][]; injected: string[] } {
  const host = options.host ?? "secret.test";
  const { head, injected } = injectSecrets(request([["Host", host], ...headers], options.target), {
    authority: { host, port: 443 },
    secrets: options.secrets ?? [GH],
  });
  assert.deepEqual(head.headers[0], ["Host", host]);
  return { headers: head.headers.slice(1), injected };
}

Deno.test("injectSecrets() replaces the placeholder inside its header's value", () => {
  assert.deepEqual(inject([["Authorization", `Bearer ${PLACEHOLDER}`]]), {
    headers: [["Authorization", "Bearer s3cret-value"]],
    injected: ["gh"],
  });
  // Header names match whatever their case; every occurrence is replaced.
  assert.deepEqual(inject([["authorization", `token ${PLACEHOLDER} ${PLACEHOLDER}`]]).headers, [
    ["authorization", "token s3cret-value s3cret-value"],
  ]);
});

Deno.test("injectSecrets() writes a bare placeholder in the secret's format", () => {
  assert.deepEqual(inject([["Authorization", PLACEHOLDER]]), {
    headers: [["Authorization", "Bearer s3cret-value"]],
    injected: ["gh"],
  });
  assert.deepEqual(inject([["X-Npm-Token", NPM.placeholder]], { secrets: [NPM] }).headers, [
    ["X-Npm-Token", "npm-value"],
  ]);
});

Deno.test("injectSecrets() replaces the placeholder inside a Basic credential", () => {
  const { headers, injected } = inject([["Authorization", basic(`x-access-token:${PLACEHOLDER}`)]]);
  assert.deepEqual(injected, ["gh"]);
  assert.deepEqual(headers, [["Authorization", basic("x-access-token:s3cret-value")]]);
  // As the user name too, and with a lower-case scheme.
  assert.deepEqual(inject([["Authorization", `basic ${btoa(`${PLACEHOLDER}:x`)}`]]).headers, [
    ["Authorization", basic("s3cret-value:x")],
  ]);
  // A Basic credential without the placeholder is left alone, byte for byte.
  const other = `Basic ${btoa("user:password")}`;
  assert.deepEqual(inject([["Authorization", other]]), {
    headers: [["Authorization", other]],
    injected: [],
  });
});

Deno.test("injectSecrets() leaves the placeholder in other headers, the target and for other hosts", () => {
  const headers: [string, string][] = [
    ["Host", "secret.test"],
    ["X-Other", PLACEHOLDER],
    ["Cookie", `token=${PLACEHOLDER}`],
    ["Proxy-Authorization", `Bearer ${PLACEHOLDER}`],
  ];
  const target = `/path?token=${PLACEHOLDER}`;
  const { head, injected } = injectSecrets(request(headers, target), {
    authority: SECRET_TEST,
    secrets: [GH],
  });
  assert.deepEqual(head.headers, headers);
  assert.equal(head.target, target);
  assert.deepEqual(injected, []);

  // The right header, but another host (exact names only: no subdomain, no suffix).
  for (const host of ["api.test", "sub.secret.test", "secret.test.evil", "SECRET.TEST.", ""]) {
    assert.deepEqual(
      inject([["Authorization", `Bearer ${PLACEHOLDER}`]], { host }),
      { headers: [["Authorization", `Bearer ${PLACEHOLDER}`]], injected: [] },
      host,
    );
  }
});

Deno.test("injectSecrets() names each secret injected once, and only those", () => {
  const { headers, injected } = inject(
    [
      ["Authorization", PLACEHOLDER],
      ["X-Npm-Token", NPM.placeholder],
      ["X-Npm-Token", `again ${NPM.placeholder}`],
      // One secret's placeholder in another secret's header stays.
      ["X-Npm-Token", PLACEHOLDER],
    ],
    { secrets: [GH, NPM] },
  );
  assert.deepEqual(headers, [
    ["Authorization", "Bearer s3cret-value"],
    ["X-Npm-Token", "npm-value"],
    ["X-Npm-Token", "again npm-value"],
    ["X-Npm-Token", PLACEHOLDER],
  ]);
  assert.deepEqual(injected.sort(), ["gh", "npm"]);
  // On npm.test only the npm secret applies.
  const npmOnly = inject(
    [["Authorization", PLACEHOLDER], ["X-Npm-Token", NPM.placeholder]],
    { host: "npm.test", secrets: [GH, NPM] },
  );
  assert.deepEqual(npmOnly, {
    headers: [["Authorization", PLACEHOLDER], ["X-Npm-Token", "npm-value"]],
    injected: ["npm"],
  });
});

Deno.test("injectSecrets() leaves a head without placeholders as it was", () => {
  const headers: [string, string][] = [["Host", "secret.test"], ["Authorization", "Bearer real"]];
  const head = request(headers);
  const result = injectSecrets(head, { authority: SECRET_TEST, secrets: [GH] });
  assert.deepEqual(result, { head, injected: [] });
  assert.deepEqual(head.headers, headers, "the input is not changed");
  assert.deepEqual(injectSecrets(head, { authority: SECRET_TEST, secrets: [] }).injected, []);
});

Deno.test("injectSecrets() writes a value holding `$` patterns as it is", () => {
  // String.prototype.replace reads `$$`, `$&`, `` $` `` and `$'` in a replacement string.
  const value = "pa$$w$&r$`d$'1";
  const dollar: HeldSecret = { ...GH, value };
  for (
    const [sent, arrived] of [
      [PLACEHOLDER, `Bearer ${value}`],
      [`token ${PLACEHOLDER}`, `token ${value}`],
      [basic(`u:${PLACEHOLDER}`), basic(`u:${value}`)],
    ]
  ) {
    assert.deepEqual(inject([["Authorization", sent!]], { secrets: [dollar] }).headers, [
      ["Authorization", arrived!],
    ]);
  }
});

Deno.test("injectSecrets() writes a secret only into a request naming the connection's host and port, an absolute form's authority winning over Host", () => {
  const authorization: [string, string] = ["Authorization", PLACEHOLDER];
  const sent = (target: string, hosts: string[], authority = SECRET_TEST): string[] =>
    injectSecrets(
      request([...hosts.map((h): [string, string] => ["Host", h]), authorization], target),
      {
        authority,
        secrets: [GH],
      },
    ).injected;
  // The issue's attack: an absolute form naming another host, Host the tunnel's.
  assert.deepEqual(sent("http://attacker.example/steal?x=1", ["secret.test"]), []);
  assert.deepEqual(sent("https://attacker.example/steal", ["secret.test"]), []);
  assert.deepEqual(sent("https://secret.test.attacker.example/", ["secret.test"]), []);
  // The right host on another port, by the target or by Host (443 when none is written).
  assert.deepEqual(sent("https://secret.test:8443/", ["secret.test"]), []);
  assert.deepEqual(sent("/", ["secret.test:8443"]), []);
  assert.deepEqual(sent("/", ["secret.test"], { host: "secret.test", port: 8443 }), []);
  // http:// means port 80 and no TLS; userinfo, asterisk-form, '//' paths: no authority at all.
  assert.deepEqual(sent("http://secret.test/", ["secret.test"]), []);
  assert.deepEqual(sent("https://u@secret.test/", ["secret.test"]), []);
  assert.deepEqual(sent("*", ["secret.test"]), []);
  assert.deepEqual(sent("//attacker.example/x", ["secret.test"]), []);
  assert.deepEqual(sent("/\\attacker.example/x", ["secret.test"]), []);
  // Without one Host, an origin form names nothing.
  assert.deepEqual(sent("/", []), []);
  assert.deepEqual(sent("/", ["secret.test", "secret.test"]), []);
  assert.deepEqual(sent("/", ["u@secret.test"]), []);

  // What names the connection's authority gets it: any case, a trailing dot,
  // the default port written or not, an absolute form over a foreign Host.
  for (
    const [target, hosts] of [
      ["/", ["secret.test"]],
      ["/", ["Secret.TEST.:443"]],
      ["https://secret.test/x?y", ["secret.test"]],
      ["HTTPS://SECRET.TEST.:443/", ["secret.test"]],
      ["https://secret.test", ["attacker.example"]],
    ] as [string, string[]][]
  ) {
    assert.deepEqual(sent(target, hosts), ["gh"], `${target} ${hosts}`);
  }
  assert.deepEqual(
    sent("/", ["secret.test:8443"], { host: "secret.test", port: 8443 }),
    ["gh"],
  );
});
