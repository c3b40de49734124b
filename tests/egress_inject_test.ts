/**
 * injectSecrets() (lib/egress/inject.ts): a placeholder becomes its
 * secret's value in the secret's header, for the secret's hosts, and
 * nowhere else.
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

function request(headers: [string, string][], target = "/"): RequestHead {
  return { method: "GET", target, version: "HTTP/1.1", headers };
}

function basic(credential: string): string {
  return `Basic ${Buffer.from(credential).toString("base64")}`;
}

function inject(
  headers: [string, string][],
  options: { host?: string; secrets?: HeldSecret[]; target?: string } = {},
): { headers: [string, string][]; injected: string[] } {
  const { head, injected } = injectSecrets(request(headers, options.target), {
    host: options.host ?? "secret.test",
    secrets: options.secrets ?? [GH],
  });
  return { headers: head.headers, injected };
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
    ["X-Other", PLACEHOLDER],
    ["Cookie", `token=${PLACEHOLDER}`],
    ["Proxy-Authorization", `Bearer ${PLACEHOLDER}`],
  ];
  const target = `/path?token=${PLACEHOLDER}`;
  const { head, injected } = injectSecrets(request(headers, target), {
    host: "secret.test",
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
  const result = injectSecrets(head, { host: "secret.test", secrets: [GH] });
  assert.deepEqual(result, { head, injected: [] });
  assert.deepEqual(head.headers, headers, "the input is not changed");
  assert.deepEqual(injectSecrets(head, { host: "secret.test", secrets: [] }).injected, []);
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
