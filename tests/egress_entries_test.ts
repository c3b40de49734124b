/**
 * Egress list entries and addresses (lib/config/egress_entries.ts): parsing,
 * display, matching, intersection and address classification. Pure: no I/O.
 */
import assert from "node:assert/strict";
import {
  addressKind,
  addressRefusal,
  allows,
  beyond,
  canonicalIp,
  checkEntry,
  formatCidr,
  formatEntry,
  hostLoopbackIn,
  inCidrs,
  intersect,
  isIpLiteral,
  mergeEntries,
  parseCidr,
  parseEntry,
} from "../lib/config/egress_entries.ts";
import type { EgressEntry } from "../lib/config/egress_types.ts";

Deno.test("parseEntry() reads names, wildcards, ports and IP literals in canonical form", () => {
  const cases: [string, EgressEntry][] = [
    ["api.github.com", { kind: "name", host: "api.github.com", ports: [80, 443] }],
    ["API.GitHub.com.", { kind: "name", host: "api.github.com", ports: [80, 443] }],
    ["localhost", { kind: "name", host: "localhost", ports: [80, 443] }],
    ["files.pythonhosted.org:443", { kind: "name", host: "files.pythonhosted.org", ports: [443] }],
    ["*.pypi.org", { kind: "suffix", host: "pypi.org", ports: [80, 443] }],
    ["*.PyPI.org.:8443", { kind: "suffix", host: "pypi.org", ports: [8443] }],
    ["a.com:8080,443,8080", { kind: "name", host: "a.com", ports: [443, 8080] }],
    ["xn--bcher-kva.example", { kind: "name", host: "xn--bcher-kva.example", ports: [80, 443] }],
    ["1.2.3.4", { kind: "ip", host: "1.2.3.4", ports: [80, 443] }],
    ["10.0.0.1:5432", { kind: "ip", host: "10.0.0.1", ports: [5432] }],
    ["[fd00::1]:8443", { kind: "ip", host: "fd00::1", ports: [8443] }],
    ["[FD00:0:0::01]", { kind: "ip", host: "fd00::1", ports: [80, 443] }],
    ["fd00::1", { kind: "ip", host: "fd00::1", ports: [80, 443] }],
    ["2001:DB8:0:0:1:0:0:1", { kind: "ip", host: "2001:db8::1:0:0:1", ports: [80, 443] }],
    ["::ffff:1.2.3.4", { kind: "ip", host: "1.2.3.4", ports: [80, 443] }],
    ["[::ffff:1.2.3.4]:443", { kind: "ip", host: "1.2.3.4", ports: [443] }],
    ["[::127.0.0.1]", { kind: "ip", host: "::7f00:1", ports: [80, 443] }],
  ];
  for (const [text, entry] of cases) assert.deepEqual(parseEntry(text), entry, text);
});

Deno.test("parseEntry() refuses what is too broad or malformed, in one line quoting the value", () => {
  const cases: [string, RegExp][] = [
    ["", /empty/],
    ["*", /too broad/],
    ["*.", /needs a domain after/],
    ["*.com", /too broad/],
    ["*.com.", /too broad/],
    ["a.*.com", /whole first label/],
    ["*foo.com", /whole first label/],
    ["01.2.3.4", /dotted decimal/],
    ["1.2.3.256", /dotted decimal/],
    ["127.1", /dotted decimal/],
    ["0x7f.0.0.1", /dotted decimal/],
    ["2130706433", /dotted decimal/],
    ["host.123", /dotted decimal/],
    ["a-.com", /label 'a-'/],
    ["-a.com", /label '-a'/],
    ["a..com", /label ''/],
    ["under_score.com", /label 'under_score'/],
    [`${"a".repeat(64)}.com`, /label/],
    [`${"abcdefghi.".repeat(26)}com`, /longer than 253/],
    ["bücher.de", /non-ASCII/],
    ["host:0", /port '0'/],
    ["host:65536", /port '65536'/],
    ["host:", /port ''/],
    ["host:08", /port '08'/],
    ["host:80,", /port ''/],
    ["[1.2.3.4]", /brackets are for IPv6/],
    ["[fd00::1", /closing/],
    ["[fd00::1]443", /only ':port'/],
    ["fe80::1%eth0", /IPv6/],
    ["1:2:3:4:5:6:7:8:9", /IPv6/],
    ["fd00::1::2", /IPv6/],
    ["https://api.github.com", /not a URL/],
    ["api.github.com/x", /not a URL/],
    ["user@host", /not a URL/],
    [" host", /not a URL/],
  ];
  for (const [text, detail] of cases) {
    assert.throws(
      () => parseEntry(text),
      (error: unknown) => {
        assert.ok(error instanceof Error, text);
        assert.ok(error.message.startsWith(`Invalid egress entry '${text}': `), error.message);
        assert.ok(!error.message.includes("\n") && !error.message.endsWith("."), error.message);
        assert.match(error.message, detail, text);
        return true;
      },
      text,
    );
    assert.ok("problem" in checkEntry(text), text);
  }
});

Deno.test("formatEntry() is read back by parseEntry() to the same entry, default ports hidden", () => {
  assert.equal(formatEntry(parseEntry("api.github.com")), "api.github.com");
  assert.equal(formatEntry(parseEntry("api.github.com:443,80")), "api.github.com");
  assert.equal(formatEntry(parseEntry("*.pypi.org:443")), "*.pypi.org:443");
  assert.equal(formatEntry(parseEntry("fd00::1")), "[fd00::1]");
  assert.equal(formatEntry(parseEntry("[fd00::1]:8443,443")), "[fd00::1]:443,8443");
  assert.equal(formatEntry(parseEntry("10.0.0.1:5432")), "10.0.0.1:5432");
  for (
    const text of ["a.com:1", "*.a.b.c:80", "1.2.3.4:80,443,8080", "[::1]:443", "x.y", "[::]"]
  ) {
    const entry = parseEntry(text);
    assert.deepEqual(parseEntry(formatEntry(entry)), entry, text);
  }
});

Deno.test("allows() matches names exactly, wildcards below their domain, IPs only as IPs", () => {
  const list = ["api.github.com:443", "*.pypi.org", "10.0.0.1:5432", "[fd00::1]"].map(parseEntry);
  const yes: [string, number][] = [
    ["api.github.com", 443],
    ["API.GitHub.COM.", 443],
    ["files.pypi.org", 80],
    ["a.b.pypi.org", 443],
    ["10.0.0.1", 5432],
    ["::ffff:10.0.0.1", 5432],
    ["[fd00::1]", 443],
    ["fd00:0::1", 80],
  ];
  const no: [string, number][] = [
    ["api.github.com", 80],
    ["github.com", 443],
    ["pypi.org", 443],
    ["evilpypi.org", 443],
    ["files.pypi.org", 8080],
    ["10.0.0.1", 443],
    ["010.0.0.1", 5432],
    ["10.1", 5432],
    ["[fd00::2]", 443],
    ["a..pypi.org", 443],
    ["", 443],
    ["files.pypi.org", 0],
    ["files.pypi.org", 443.5],
  ];
  for (const [host, port] of yes) assert.equal(allows(list, host, port), true, `${host}:${port}`);
  for (const [host, port] of no) assert.equal(allows(list, host, port), false, `${host}:${port}`);
  assert.equal(allows([], "a.com", 443), false);
});

Deno.test("intersect() allows exactly what both lists allow (property over hosts and ports)", () => {
  const lists = [
    ["*.github.com", "api.github.com:443", "1.2.3.4"],
    ["*.api.github.com:443", "*.github.com:80", "pypi.org"],
    ["*.pypi.org:443", "files.pythonhosted.org", "[fd00::1]:443"],
    ["api.github.com", "*.pypi.org", "1.2.3.4:80", "fd00::1"],
    ["*.a.pypi.org", "github.com:443,8080"],
    [],
  ].map((texts) => texts.map(parseEntry));
  const hosts = [
    "api.github.com",
    "x.api.github.com",
    "github.com",
    "raw.github.com",
    "pypi.org",
    "files.pypi.org",
    "b.a.pypi.org",
    "a.pypi.org",
    "files.pythonhosted.org",
    "1.2.3.4",
    "fd00::1",
    "other.net",
  ];
  const ports = [80, 443, 8080];
  for (const a of lists) {
    for (const b of lists) {
      const both = intersect(a, b);
      for (const host of hosts) {
        for (const port of ports) {
          assert.equal(
            allows(both, host, port),
            allows(a, host, port) && allows(b, host, port),
            `${a.map(formatEntry)} ∩ ${b.map(formatEntry)} at ${host}:${port}`,
          );
        }
      }
    }
  }
});

Deno.test("intersect() keeps the narrower entry, intersects ports, drops empties and merges duplicates", () => {
  const e = (...texts: string[]): EgressEntry[] => texts.map(parseEntry);
  assert.deepEqual(intersect(e("*.github.com"), e("api.github.com:443")), e("api.github.com:443"));
  assert.deepEqual(intersect(e("*.github.com"), e("*.api.github.com")), e("*.api.github.com"));
  assert.deepEqual(intersect(e("*.a.com"), e("*.a.com:443")), e("*.a.com:443"));
  assert.deepEqual(intersect(e("a.com:80"), e("a.com:443")), []);
  assert.deepEqual(intersect(e("a.com"), e("*.a.com")), []);
  assert.deepEqual(intersect(e("a.com:80", "a.com:443"), e("a.com")), e("a.com"));
  assert.deepEqual(intersect(e("1.2.3.4"), e("[::ffff:1.2.3.4]:443")), e("1.2.3.4:443"));
  assert.deepEqual(intersect(e("a.com"), []), []);
  assert.deepEqual(mergeEntries(e("a.com:443", "A.com:80", "b.com")), e("a.com", "b.com"));
});

Deno.test("beyond() is what a list allows past a limit, port by port", () => {
  const e = (...texts: string[]): EgressEntry[] => texts.map(parseEntry);
  assert.deepEqual(beyond(e("api.github.com:443"), e("*.github.com")), []);
  assert.deepEqual(beyond(e("api.github.com"), e("api.github.com:443")), e("api.github.com:80"));
  assert.deepEqual(beyond(e("*.github.com"), e("api.github.com")), e("*.github.com"));
  assert.deepEqual(beyond(e("*.a.github.com"), e("*.github.com:80", "*.github.com:443")), []);
  assert.deepEqual(beyond(e("a.com", "b.com"), e("b.com")), e("a.com"));
  assert.deepEqual(beyond([], []), []);
});

Deno.test("canonicalIp() and isIpLiteral() accept dotted decimal and IPv6, brackets optional", () => {
  assert.equal(canonicalIp("8.8.8.8"), "8.8.8.8");
  assert.equal(canonicalIp("[FD00:0:0::01]"), "fd00::1");
  assert.equal(canonicalIp("0:0:0:0:0:0:0:1"), "::1");
  assert.equal(canonicalIp("::"), "::");
  assert.equal(canonicalIp("1:0:0:1:0:0:0:1"), "1:0:0:1::1");
  assert.equal(canonicalIp("1:0:1:1:1:1:1:1"), "1:0:1:1:1:1:1:1"); // a single zero group stays
  assert.equal(canonicalIp("::FFFF:10.0.0.1"), "10.0.0.1");
  assert.equal(canonicalIp("[::ffff:a00:1]"), "10.0.0.1");
  assert.equal(canonicalIp("64:ff9b::1.2.3.4"), "64:ff9b::102:304");
  for (
    const bad of [
      "010.0.0.1",
      "1.2.3",
      "1.2.3.4.5",
      "0x7f.0.0.1",
      "fe80::1%eth0",
      "a.com",
      "",
      "[1.2.3.4]",
      "::ffff:1.2.3",
    ]
  ) {
    assert.equal(canonicalIp(bad), undefined, bad);
    assert.equal(isIpLiteral(bad), false, bad);
  }
  assert.equal(isIpLiteral("[::1]"), true);
  assert.equal(isIpLiteral("127.0.0.1"), true);
});

Deno.test("addressKind() classifies IPv4, IPv6 and IPv6 forms of IPv4", () => {
  const cases: [string, string][] = [
    ["0.0.0.0", "unspecified"],
    ["0.1.2.3", "unspecified"],
    ["127.0.0.1", "loopback"],
    ["127.255.0.1", "loopback"],
    ["10.1.2.3", "private"],
    ["172.16.0.1", "private"],
    ["172.31.255.255", "private"],
    ["172.32.0.1", "public"],
    ["192.168.1.1", "private"],
    ["100.64.0.1", "private"],
    ["100.127.255.255", "private"],
    ["100.128.0.1", "public"],
    ["169.254.1.1", "link-local"],
    ["169.254.169.254", "metadata"],
    ["224.0.0.1", "multicast"],
    ["239.255.255.255", "multicast"],
    ["240.0.0.1", "reserved"],
    ["255.255.255.255", "reserved"],
    ["192.0.0.170", "reserved"],
    ["198.18.0.1", "reserved"],
    ["198.19.255.255", "reserved"],
    ["198.20.0.1", "public"],
    ["8.8.8.8", "public"],
    ["::", "unspecified"],
    ["::1", "loopback"],
    ["[::1]", "loopback"],
    ["fc00::1", "private"],
    ["fd12:3456::1", "private"],
    ["fe80::1", "link-local"],
    ["febf::1", "link-local"],
    ["ff02::1", "multicast"],
    ["fd00:ec2::254", "metadata"],
    ["::ffff:127.0.0.1", "loopback"],
    ["::ffff:169.254.169.254", "metadata"],
    ["::127.0.0.1", "loopback"],
    ["::10.0.0.1", "private"],
    ["64:ff9b::10.0.0.1", "private"],
    ["64:ff9b::8.8.8.8", "public"],
    ["2606:4700:4700::1111", "public"],
    ["2001:4860::8888", "public"],
    ["100::1", "reserved"],
  ];
  for (const [ip, kind] of cases) assert.equal(addressKind(ip), kind, ip);
  assert.throws(() => addressKind("localhost"), /Invalid IP address 'localhost'/);
});

Deno.test("parseCidr(), formatCidr() and inCidrs() take CIDRs and bare addresses", () => {
  assert.deepEqual(parseCidr("127.0.0.1"), { ip: "127.0.0.1", bits: 32 });
  assert.deepEqual(parseCidr("10.0.0.0/8"), { ip: "10.0.0.0", bits: 8 });
  assert.deepEqual(parseCidr("FD00::/8"), { ip: "fd00::", bits: 8 });
  assert.deepEqual(parseCidr("[fd00::1]"), { ip: "fd00::1", bits: 128 });
  assert.deepEqual(parseCidr("::ffff:10.0.0.0/104"), { ip: "10.0.0.0", bits: 8 });
  assert.deepEqual(parseCidr("0.0.0.0/0"), { ip: "0.0.0.0", bits: 0 });
  assert.equal(formatCidr(parseCidr("::1")), "::1/128");
  const bad: [string, RegExp][] = [
    ["10.1.0.0/8", /did you mean '10.0.0.0\/8'/],
    ["1.2.3.4/33", /prefix length '33'/],
    ["1.2.3.4/", /prefix length ''/],
    ["1.2.3.4/08", /prefix length '08'/],
    ["fd00::/129", /prefix length '129'/],
    ["::ffff:0.0.0.0/80", /shorter than \/96/],
    ["localhost/8", /not an IP address/],
    ["", /not an IP address/],
  ];
  for (const [text, detail] of bad) {
    assert.throws(() => parseCidr(text), (error: unknown) => {
      assert.ok(error instanceof Error);
      assert.ok(error.message.startsWith(`Invalid CIDR '${text}': `), error.message);
      assert.match(error.message, detail);
      return true;
    });
  }
  assert.equal(inCidrs("10.9.8.7", ["10.0.0.0/8"]), true);
  assert.equal(inCidrs("11.0.0.1", ["10.0.0.0/8"]), false);
  assert.equal(inCidrs("::ffff:10.9.8.7", ["10.0.0.0/8"]), true);
  assert.equal(inCidrs("[fd00::5]", ["fd00::/8"]), true);
  assert.equal(inCidrs("fd00::5", ["10.0.0.0/8"]), false);
  assert.equal(inCidrs("1.2.3.4", ["0.0.0.0/0"]), true);
  assert.equal(inCidrs("not-an-ip", ["0.0.0.0/0"]), false);
  assert.throws(() => inCidrs("1.2.3.4", ["1.2.3.4/99"]), /Invalid CIDR/);
});

Deno.test("addressRefusal() passes public addresses and allowed CIDRs, and names the kind otherwise", () => {
  assert.equal(addressRefusal("8.8.8.8", []), undefined);
  assert.equal(addressRefusal("2606:4700::1", []), undefined);
  assert.equal(
    addressRefusal("127.0.0.1", []),
    "'127.0.0.1' is a loopback address (not in egress_addresses)",
  );
  assert.equal(addressRefusal("127.0.0.1", ["127.0.0.1/32"]), undefined);
  assert.equal(addressRefusal("10.1.2.3", ["10.0.0.0/8"]), undefined);
  assert.equal(
    addressRefusal("10.1.2.3", ["10.0.0.0/16"]),
    "'10.1.2.3' is a private address (not in egress_addresses)",
  );
  assert.equal(
    addressRefusal("::ffff:169.254.169.254", []),
    "'169.254.169.254' is a metadata address (not in egress_addresses)",
  );
  assert.equal(
    addressRefusal("0.0.0.0", []),
    "'0.0.0.0' is an unspecified address (not in egress_addresses)",
  );
  assert.equal(
    addressRefusal("[fe80::1]", []),
    "'fe80::1' is a link-local address (not in egress_addresses)",
  );
  assert.equal(addressRefusal("localhost", []), "'localhost' is not an IP address");
});

Deno.test("addressKind() judges 6to4 by the IPv4 address it carries and refuses Teredo and documentation ranges", () => {
  assert.equal(addressKind("2002:7f00:1::"), "loopback");
  assert.equal(addressKind("2002:a00:1::1"), "private");
  assert.equal(addressKind("2002:101:101::1"), "public");
  assert.equal(addressKind("2001:0:4136:e378::1"), "reserved");
  assert.equal(addressKind("2001:db8::1"), "reserved");
  for (const ip of ["192.0.2.1", "198.51.100.7", "203.0.113.9"]) {
    assert.equal(addressKind(ip), "reserved");
  }
  assert.equal(addressKind("2606:4700::1111"), "public");
});

Deno.test("hostLoopbackIn() names the host loopback part a CIDR covers, in every form that reaches it", () => {
  const cases: [string, string | undefined][] = [
    ["127.0.0.1", "127.0.0.1/32"],
    ["127.0.0.0/8", "127.0.0.0/8"],
    ["126.0.0.0/7", "127.0.0.0/8"],
    ["0.0.0.0/0", "127.0.0.0/8"],
    ["0.0.0.0/1", "127.0.0.0/8"],
    ["0.0.0.0", "0.0.0.0/32"],
    ["::1", "::1/128"],
    ["::", "::/128"],
    ["::/0", "::1/128"],
    ["::/96", "::1/128"],
    ["::ffff:127.0.0.1", "127.0.0.1/32"],
    ["::ffff:0:0/96", "127.0.0.0/8"],
    ["::127.0.0.1", "::7f00:1/128"],
    ["64:ff9b::/96", "64:ff9b::7f00:0/104"],
    ["2002::/16", "2002:7f00::/24"],
    ["10.0.0.0/8", undefined],
    ["128.0.0.0/1", undefined],
    ["126.0.0.0/8", undefined],
    ["0.0.0.1", undefined],
    ["fd00::/8", undefined],
    ["::2", undefined],
    ["::ffff:10.0.0.0/104", undefined],
    ["64:ff9b::a00:0/104", undefined],
  ];
  for (const [cidr, covered] of cases) assert.equal(hostLoopbackIn(cidr), covered, cidr);
  // What it names is loopback (or unspecified) by addressKind, the one owner of the kinds.
  for (const [, covered] of cases) {
    if (covered === undefined) continue;
    const kind = addressKind(parseCidr(covered).ip);
    assert.ok(["loopback", "unspecified"].includes(kind), `${covered}: ${kind}`);
  }
  assert.throws(() => hostLoopbackIn("localhost"), /Invalid CIDR 'localhost'/);
});
