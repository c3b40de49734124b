/**
 * `narrowEgress`: E2B's network settings on what the config grants, narrowed
 * and never widened; what has no exact expression refused (400).
 *
 * @module
 */
import assert from "node:assert/strict";
import { parseEntry } from "../lib/config/egress_entries.ts";
import { type EgressGrant, narrowEgress } from "../lib/serve/network.ts";

const NONE: EgressGrant = {
  network: "none",
  egress: undefined,
  egressAddresses: [],
  egressAllowHostLoopback: false,
};
const BRIDGE: EgressGrant = { ...NONE, network: "bridge" };
const LIST: EgressGrant = {
  ...NONE,
  egress: ["one.test:8001", "*.two.test:443", "127.0.0.3:8003"].map(parseEntry),
  egressAddresses: ["127.0.0.0/8"],
  egressAllowHostLoopback: true,
};

Deno.test("narrowEgress: nothing granted takes only narrowing; asking for more is a 403 naming the key", () => {
  assert.deepEqual(narrowEgress(NONE, {}), { overrides: {} });
  assert.deepEqual(narrowEgress(NONE, { allowInternetAccess: false, denyOut: ["10.0.0.0/8"] }), {
    overrides: {},
  });
  const internet = narrowEgress(NONE, { allowInternetAccess: true });
  assert.ok("status" in internet && internet.status === 403);
  assert.match(internet.message, /'sandbox\.network = "bridge"'/);
  const out = narrowEgress(NONE, { allowOut: ["example.com"] });
  assert.ok("status" in out && out.status === 403);
  assert.match(out.message, /Network allowOut 'example\.com' .*'sandbox\.egress'/);
});

Deno.test("narrowEgress: a list narrows to what allowOut names, on the ports the list grants it", () => {
  assert.deepEqual(
    narrowEgress(LIST, { allowInternetAccess: false, allowOut: ["one.test", "a.two.test"] }),
    { overrides: { egress: ["one.test:8001", "a.two.test:443"].map(parseEntry) } },
  );
  assert.deepEqual(narrowEgress(LIST, { denyOut: ["0.0.0.0/0"], allowOut: ["127.0.0.3/32"] }), {
    overrides: { egress: [parseEntry("127.0.0.3:8003")] },
  });
  assert.deepEqual(narrowEgress(LIST, { allowInternetAccess: false }), {
    overrides: { egress: [] },
  });
  // allowOut alone restricts nothing (E2B: all traffic is allowed without a deny).
  assert.deepEqual(narrowEgress(LIST, { allowOut: ["one.test"] }), { overrides: {} });
});

Deno.test("narrowEgress: asking a list for more than it grants is a 403 naming the values", () => {
  for (const wider of ["other.test", "*.two.test:8443", "two.test", "127.0.0.0/24", "10.0.0.1"]) {
    const got = narrowEgress(LIST, { allowInternetAccess: false, allowOut: ["one.test", wider] });
    assert.ok("status" in got && got.status === 403, `${wider}: ${JSON.stringify(got)}`);
    assert.match(got.message, new RegExp(`allowOut '${wider.replace(/[.*]/g, "\\$&")}'`));
    assert.match(got.message, /'sandbox\.egress'/);
  }
});

Deno.test("narrowEgress: denyOut takes addresses off a list; allowOut wins; a range over names is a 400", () => {
  assert.deepEqual(
    narrowEgress(LIST, { denyOut: ["127.0.0.3"], allowOut: ["one.test", "*.two.test"] }),
    { overrides: { egress: ["one.test:8001", "*.two.test:443"].map(parseEntry) } },
  );
  assert.deepEqual(
    narrowEgress(LIST, {
      denyOut: ["127.0.0.0/8"],
      allowOut: ["one.test", "*.two.test", "127.0.0.3"],
    }),
    {
      overrides: { egress: ["one.test:8001", "*.two.test:443", "127.0.0.3:8003"].map(parseEntry) },
    },
  );
  const names = narrowEgress(LIST, { denyOut: ["127.0.0.3"] });
  assert.ok("status" in names && names.status === 400);
  assert.match(names.message, /Network denyOut '127\.0\.0\.3\/32' cannot be expressed/);
  assert.match(names.message, /one\.test:8001/);
  const domain = narrowEgress(LIST, { denyOut: ["one.test"] });
  assert.ok("status" in domain && domain.status === 400);
  assert.match(domain.message, /Network denyOut 'one\.test' is not an IP address or CIDR/);
  const bad = narrowEgress(LIST, { allowOut: ["not a host"] });
  assert.ok("status" in bad && bad.status === 400);
  assert.match(bad.message, /Network allowOut 'not a host'/);
});

Deno.test("narrowEgress: anything narrowed goes through the proxy, to allowOut only", () => {
  assert.deepEqual(narrowEgress(BRIDGE, { allowInternetAccess: true }), { overrides: {} });
  assert.deepEqual(narrowEgress(BRIDGE, { allowInternetAccess: false }), {
    overrides: { network: "none" },
  });
  assert.deepEqual(
    narrowEgress(BRIDGE, {
      denyOut: ["0.0.0.0/0"],
      allowOut: ["api.example.com", "172.17.0.1", "1.1.1.1/32", "127.0.0.1"],
    }),
    {
      overrides: {
        network: "none",
        egress: ["api.example.com", "172.17.0.1", "1.1.1.1"].map(parseEntry),
        egressAddresses: ["172.17.0.1/32"],
        egressAllowHostLoopback: true,
      },
    },
  );
  const range = narrowEgress(BRIDGE, { allowInternetAccess: false, allowOut: ["10.0.0.0/8"] });
  assert.ok("status" in range && range.status === 400);
  assert.match(range.message, /Network allowOut '10\.0\.0\.0\/8' cannot be expressed/);
  const some = narrowEgress(BRIDGE, { denyOut: ["8.8.8.8"] });
  assert.ok("status" in some && some.status === 400);
  assert.match(some.message, /Network denyOut '8\.8\.8\.8\/32' cannot be expressed/);
});
