/*
 * waffle-spawn: start one sandboxed command in its own session, as the
 * sandbox's uid, exec'ing in place.
 *
 *   spawn UID GID PROGRAM [ARGS...]   setsid, drop to UID:GID (no groups), exec
 *   spawn - PROGRAM [ARGS...]         setsid, exec (no uid drop)
 *   spawn --tty /dev/pts/N ...        as above, on that terminal: after setsid
 *                                     it opens the pty (as the runner, which
 *                                     owns it), makes it the controlling
 *                                     terminal and stdin, stdout and stderr
 *
 * Why it exists: Deno starts a child with posix_spawn (vfork + exec, cheap)
 * unless it must run code between fork and exec (setsid, a uid/gid drop);
 * then it forks the whole runner, 7-17 ms. So the runner (runner/spawn.ts)
 * posix_spawns this helper, which does that work and execs the command: the
 * pid Deno got stays the command's pid. It replaces a chain of three
 * dynamically linked exec-in-place wrappers (setsid, setpriv, env -i).
 *
 * Why it may see the request's environment although it runs as root: it is
 * linked statically, so there is no dynamic loader to honour LD_PRELOAD,
 * LD_LIBRARY_PATH, LD_AUDIT...; and it calls nothing that loads code or data
 * named by the environment (no stdio, locale, iconv/GCONV_PATH, NSS or
 * gettext: messages come from strerrordesc_np, which does not translate).
 * The environment is handed on unchanged to the command's execve, which
 * happens only after the drop. (Static glibc's startup still reads
 * GLIBC_TUNABLES: malloc and CPU-dispatch tuning of this process, no loading.)
 *
 * Contract, and nothing else:
 * - UID and GID are decimal digits only, at most 4294967294 ((uid_t)-1 is
 *   reserved); anything else is a usage error;
 * - setsid() must succeed (a posix_spawned child is no group leader): the
 *   command gets pid == pgid == sid;
 * - with a uid: setgroups(0, NULL), setgid(GID), setuid(UID), each checked,
 *   then getuid/geteuid/getgid/getegid and getgroups must show the drop;
 * - execve(PROGRAM, [PROGRAM, ARGS...], environ): PROGRAM is used as given
 *   (the runner passes an absolute path), never searched for in PATH.
 * Any failure before the exec: one line on stderr, exit 126. A failed exec:
 * "waffle-spawn: '<program>': <reason>", exit 127 for ENOENT/ENOTDIR (not
 * found), 126 otherwise, as shells do.
 *
 * Build: gcc -static -Os -o spawn image/spawn_helper.c (image/build_rootfs.sh
 * installs it as /usr/libexec/waffle/spawn, 0755 root).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/types.h>
#include <unistd.h>

extern char **environ;

#define CANNOT_RUN 126
#define NOT_FOUND 127

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

static const char *reason(int error) {
  const char *text = strerrordesc_np(error);
  return text != NULL ? text : "Unknown error";
}

/*
 * "waffle-spawn: <what>: <reason>" on stderr (no reason for error 0; an empty
 * `what` continues a line begun by the caller), then exit with `status`.
 */
static _Noreturn void fail(const char *what, int error, int status) {
  if (what[0] != '\0') {
    say("waffle-spawn: ");
    say(what);
  }
  if (error != 0) {
    say(": ");
    say(reason(error));
  }
  say("\n");
  _exit(status);
}

/* A uid or gid: 1-10 decimal digits, at most 4294967294. */
static int parse_id(const char *text, unsigned long long *out) {
  unsigned long long value = 0;
  size_t length = 0;
  for (; text[length] != '\0'; length++) {
    if (text[length] < '0' || text[length] > '9' || length >= 10) return -1;
    value = value * 10 + (unsigned long long)(text[length] - '0');
  }
  if (length == 0 || value > 4294967294ULL) return -1;
  *out = value;
  return 0;
}

static void drop_to(uid_t uid, gid_t gid) {
  /* Groups and gid first: both need the privilege the uid drop gives up. */
  if (setgroups(0, NULL) != 0) fail("setgroups", errno, CANNOT_RUN);
  if (setgid(gid) != 0) fail("setgid", errno, CANNOT_RUN);
  if (setuid(uid) != 0) fail("setuid", errno, CANNOT_RUN);
  /* As root, setuid/setgid set the real, effective and saved ids alike. */
  if (getuid() != uid || geteuid() != uid || getgid() != gid || getegid() != gid ||
      getgroups(0, NULL) != 0) {
    fail("the uid/gid drop did not take effect", 0, CANNOT_RUN);
  }
}

/* "/dev/pts/" and 1-9 digits: a pty slave of the container's devpts, nothing else. */
static int pty_path(const char *path) {
  const char *prefix = "/dev/pts/";
  size_t length = strlen(prefix), digits = 0;
  if (strncmp(path, prefix, length) != 0) return -1;
  for (path += length; path[digits] != '\0'; digits++) {
    if (path[digits] < '0' || path[digits] > '9' || digits >= 9) return -1;
  }
  return digits == 0 ? -1 : 0;
}

/* The new session's controlling terminal, and the command's three streams. */
static void take_terminal(const char *path) {
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) fail(path, errno, CANNOT_RUN);
  if (ioctl(fd, TIOCSCTTY, 0) != 0) fail("TIOCSCTTY", errno, CANNOT_RUN);
  for (int stream = 0; stream <= 2; stream++) {
    if (dup2(fd, stream) != stream) fail("dup2", errno, CANNOT_RUN);
  }
  if (fd > 2) close(fd);
}

int main(int argc, char **argv) {
  int first = 1, program;
  const char *tty = NULL;
  unsigned long long uid = 0, gid = 0;
  if (argc >= 3 && strcmp(argv[1], "--tty") == 0) {
    if (pty_path(argv[2]) != 0) fail("invalid --tty path", 0, CANNOT_RUN);
    tty = argv[2];
    first = 3;
  }
  if (argc - first >= 2 && strcmp(argv[first], "-") == 0) {
    program = first + 1;
  } else if (argc - first >= 3) {
    program = first + 2;
    if (parse_id(argv[first], &uid) != 0) fail("invalid UID", 0, CANNOT_RUN);
    if (parse_id(argv[first + 1], &gid) != 0) fail("invalid GID", 0, CANNOT_RUN);
  } else {
    fail("usage: spawn [--tty /dev/pts/N] UID GID PROGRAM [ARGS...] | spawn [--tty ...] - PROGRAM"
         " [ARGS...]", 0, CANNOT_RUN);
  }
  /* Before anything else: leave the runner's session and process group. */
  if (setsid() < 0) fail("setsid", errno, CANNOT_RUN);
  /* Opened as the runner (the pty's owner), before the drop. */
  if (tty != NULL) take_terminal(tty);
  if (program == first + 2) drop_to((uid_t)uid, (gid_t)gid);
  execve(argv[program], &argv[program], environ);
  int error = errno;
  say("waffle-spawn: '");
  say(argv[program]);
  say("'");
  fail("", error, error == ENOENT || error == ENOTDIR ? NOT_FOUND : CANNOT_RUN);
}
