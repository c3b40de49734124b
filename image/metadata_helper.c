/*
 * waffle-metadata: the in-sandbox half of reading E2B file metadata (the
 * files' extended attributes under a prefix), as a small static program so
 * a Stat costs what a small command costs rather than a Deno start.
 *
 *   metadata PREFIX BYTES KEYS < paths
 *
 * It runs as any other command (the sandbox's uid, nothing of the runner's
 * privileges), started by the host from the runtime kit (/opt/waffle/rt).
 * The host owns the rules (lib/files/metadata.ts) and passes the prefix and
 * the limits; it caps this answer's size, checks it with its schema and
 * applies the rules again, so nothing here is trusted.
 *
 * Contract: the same answer, byte for byte, as `waffle files metadata -`
 * (reportMetadata in lib/files/metadata.ts):
 * - stdin: paths, each ended by a NUL (a trailing unended one is ignored);
 * - stdout: one JSON object and a newline, `{"<index>": REPORT, ...}` in
 *   order, naming only the paths with metadata or over the limit, where
 *   REPORT is `[["<base64 key>","<base64 value>"], ...]` (the key without
 *   the prefix, in llistxattr's order) or the bytes seen once over BYTES
 *   (a decimal number); only digits and base64 are ever printed;
 * - each path's last component is never followed (llistxattr, lgetxattr);
 * - a list of names over XATTR_LIST_MAX reports 65536; a value over BYTES
 *   reports the bytes so far plus BYTES + 1; once the keys (each with the
 *   prefix) and values pass BYTES, or KEYS pairs are kept, the bytes so far;
 * - a file that cannot have attributes (ENOTSUP, ENOENT, ...) reports
 *   nothing, as does one whose attribute read fails otherwise; an attribute
 *   removed between the list and its read (ENODATA) is skipped.
 * Usage errors: one line on stderr, exit 2. A failed write: exit 1.
 *
 * No stdio, locale or allocation: fixed buffers and write(2) only.
 *
 * Build: gcc -static -Os -o metadata image/metadata_helper.c
 * (image/runtime_kit.sh builds it into the kit beside the spawn helper).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/limits.h>
#include <string.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#define LIST_BYTES XATTR_LIST_MAX
#define MOST_BYTES 65536

static char names[LIST_BYTES];
static char value[MOST_BYTES + 1];
static char path[PATH_MAX + 1];
static char out[1 << 16];
static size_t out_used;
static const char *prefix;
static size_t prefix_length;
static long most_bytes, most_keys;

static void say(const char *text) {
  size_t length = strlen(text);
  while (length > 0) {
    ssize_t written = write(STDERR_FILENO, text, length);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;
    text += written;
    length -= (size_t)written;
  }
}

static void flush(void) {
  size_t at = 0;
  while (at < out_used) {
    ssize_t written = write(STDOUT_FILENO, out + at, out_used - at);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) _exit(1);
    at += (size_t)written;
  }
  out_used = 0;
}

static void put(const char *bytes, size_t length) {
  while (length > 0) {
    if (out_used == sizeof out) flush();
    size_t room = sizeof out - out_used;
    size_t take = length < room ? length : room;
    memcpy(out + out_used, bytes, take);
    out_used += take;
    bytes += take;
    length -= take;
  }
}

static void put_text(const char *text) { put(text, strlen(text)); }

static void put_number(unsigned long number) {
  char digits[24];
  size_t at = sizeof digits;
  do {
    digits[--at] = (char)('0' + number % 10);
    number /= 10;
  } while (number > 0);
  put(digits + at, sizeof digits - at);
}

/* Standard base64 with padding, as btoa writes it. */
static void put_base64(const unsigned char *bytes, size_t length) {
  static const char alphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char quad[4];
  for (size_t at = 0; at < length; at += 3) {
    unsigned long group = (unsigned long)bytes[at] << 16;
    if (at + 1 < length) group |= (unsigned long)bytes[at + 1] << 8;
    if (at + 2 < length) group |= bytes[at + 2];
    quad[0] = alphabet[(group >> 18) & 63];
    quad[1] = alphabet[(group >> 12) & 63];
    quad[2] = at + 1 < length ? alphabet[(group >> 6) & 63] : '=';
    quad[3] = at + 2 < length ? alphabet[group & 63] : '=';
    put(quad, 4);
  }
}

/* A report: a JSON array of pairs, or the bytes seen once over the limit. */
struct report {
  int over;
  unsigned long bytes;
  /* How many pairs are kept (their bytes in `kept`). */
  long pairs;
};

static unsigned char kept[MOST_BYTES * 2];
static size_t kept_used;
static size_t kept_key[MOST_BYTES], kept_key_length[MOST_BYTES];
static size_t kept_value[MOST_BYTES], kept_value_length[MOST_BYTES];

static size_t keep(const void *bytes, size_t length) {
  size_t at = kept_used;
  memcpy(kept + at, bytes, length);
  kept_used += length;
  return at;
}

static struct report read_path(void) {
  struct report report = {0, 0, 0};
  kept_used = 0;
  ssize_t listed = llistxattr(path, names, sizeof names);
  if (listed < 0) {
    if (errno == ERANGE) report.over = 1, report.bytes = LIST_BYTES;
    return report;
  }
  size_t start = 0;
  for (size_t at = 0; at < (size_t)listed; at++) {
    if (names[at] != '\0') continue;
    const char *name = names + start;
    size_t name_length = at - start;
    start = at + 1;
    if (name_length < prefix_length || memcmp(name, prefix, prefix_length) != 0) continue;
    ssize_t size = lgetxattr(path, name, value, (size_t)most_bytes + 1);
    if (size < 0) {
      if (errno == ENODATA) continue;
      if (errno == ERANGE) {
        report.over = 1;
        report.bytes += (unsigned long)most_bytes + 1;
      } else {
        report.pairs = 0;
        report.bytes = 0;
      }
      return report;
    }
    size_t key_length = name_length - prefix_length;
    report.bytes += prefix_length + key_length + (size_t)size;
    if (report.bytes > (unsigned long)most_bytes || report.pairs >= most_keys) {
      report.over = 1;
      return report;
    }
    kept_key[report.pairs] = keep(name + prefix_length, key_length);
    kept_key_length[report.pairs] = key_length;
    kept_value[report.pairs] = keep(value, (size_t)size);
    kept_value_length[report.pairs] = (size_t)size;
    report.pairs++;
  }
  return report;
}

static int answered;

static void answer(unsigned long index) {
  struct report report = read_path();
  if (!report.over && report.pairs == 0) return;
  put_text(answered ? ",\"" : "\"");
  answered = 1;
  put_number(index);
  put_text("\":");
  if (report.over) {
    put_number(report.bytes);
    return;
  }
  put_text("[");
  for (long pair = 0; pair < report.pairs; pair++) {
    put_text(pair == 0 ? "[\"" : ",[\"");
    put_base64(kept + kept_key[pair], kept_key_length[pair]);
    put_text("\",\"");
    put_base64(kept + kept_value[pair], kept_value_length[pair]);
    put_text("\"]");
  }
  put_text("]");
}

/* A decimal limit from 1 to MOST_BYTES, or -1. */
static long limit(const char *text) {
  long number = 0;
  if (*text == '\0') return -1;
  for (; *text != '\0'; text++) {
    if (*text < '0' || *text > '9') return -1;
    number = number * 10 + (*text - '0');
    if (number > MOST_BYTES) return -1;
  }
  return number > 0 ? number : -1;
}

int main(int argc, char **argv) {
  if (argc != 4 || (prefix_length = strlen(argv[1])) == 0 || prefix_length > 255 ||
      (most_bytes = limit(argv[2])) < 0 || (most_keys = limit(argv[3])) < 0) {
    say("waffle-metadata: usage: metadata PREFIX BYTES KEYS < NUL-ended paths\n");
    return 2;
  }
  prefix = argv[1];
  put_text("{");
  char chunk[1 << 16];
  size_t used = 0;
  int too_long = 0;
  unsigned long index = 0;
  for (;;) {
    ssize_t got = read(STDIN_FILENO, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    for (ssize_t at = 0; at < got; at++) {
      if (chunk[at] != '\0') {
        if (used < PATH_MAX) path[used++] = chunk[at];
        else too_long = 1;
        continue;
      }
      path[used] = '\0';
      /* Longer than PATH_MAX: the kernel refuses it (ENAMETOOLONG), so nothing. */
      if (!too_long) answer(index);
      index++;
      used = 0;
      too_long = 0;
    }
  }
  put_text("}\n");
  flush();
  return 0;
}
