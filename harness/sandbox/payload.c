/* The sandbox's self-test payload: a shared library that tries every action a candidate must not be
 * able to do, once from its constructor (while it is being loaded) and once inside an exported call.
 *
 * Built with the system C compiler by harness.sandbox.selftest, loaded by a sandboxed worker, which
 * calls astra_selftest_call() and then reads astra_selftest_report(). Each attempt is recorded as
 *     PHASE ACTION did=0|1 errno=N detail
 * where did=1 means the action succeeded. The report is a claim; the self-test also checks the effects
 * itself (a directory, a file, a marker, a TCP connection, a signal), so a payload that lied would not
 * pass either. Where an attempt would be run by a new program, library or process, that code leaves a
 * marker in the worker's writable directory: the marker proves it ran.
 *
 * Paths come from the environment (getenv needs no system call):
 *   ASTRA_SELFTEST_OUTSIDE   a directory outside the allow-list (mkdir and write targets go there)
 *   ASTRA_SELFTEST_SECRET    a file outside the allow-list (read target)
 *   ASTRA_SELFTEST_WRITABLE  the worker's writable directory (markers, the written copy of this library)
 *   ASTRA_SELFTEST_OTHER     another library outside the allow-list (dlopen target; harness/sandbox/other.c)
 *   ASTRA_SELFTEST_SELF      this library's own file (its bytes are what gets written and mapped)
 *   ASTRA_SELFTEST_PORT      a TCP port on 127.0.0.1 the self-test listens on
 * A copy of this library loaded again (a written copy, a memfd) only leaves a marker: ASTRA_SELFTEST_NESTED.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_RECORDS 64
struct record {
  char phase[16];
  char action[32];
  int did;
  int err;
  char detail[96];
};
static struct record records[MAX_RECORDS];
static int n_records;
static const char *phase = "constructor";

static void note(const char *action, int did, int err, const char *detail) {
  if (n_records >= MAX_RECORDS) return;
  struct record *r = &records[n_records++];
  snprintf(r->phase, sizeof r->phase, "%s", phase);
  snprintf(r->action, sizeof r->action, "%s", action);
  r->did = did;
  r->err = err;
  snprintf(r->detail, sizeof r->detail, "%s", detail ? detail : "");
  for (char *c = r->detail; *c; ++c)
    if (*c == '\n' || *c == ' ') *c = '_';
}

static const char *env(const char *name) {
  const char *value = getenv(name);
  return value ? value : "";
}

/* ASTRA_SELFTEST_SKIP: a comma-separated list of actions not to try (the unsandboxed control run skips
 * the ones that would replace the process). */
static int skipped(const char *action) {
  const char *list = env("ASTRA_SELFTEST_SKIP");
  size_t len = strlen(action);
  for (const char *at = strstr(list, action); at; at = strstr(at + 1, action))
    if ((at == list || at[-1] == ',') && (at[len] == ',' || at[len] == 0)) return 1;
  return 0;
}

static void path_in(char *out, size_t size, const char *dir_env, const char *name) {
  snprintf(out, size, "%s/%s-%s", env(dir_env), name, phase);
}

/* A system call made with the two opcode bytes of `syscall` written as data: no call to libc and no
 * `syscall` mnemonic anywhere in the source. */
static long raw_syscall3(long number, long a, long b, long c) {
  long result;
  register long rdi __asm__("rdi") = a;
  register long rsi __asm__("rsi") = b;
  register long rdx __asm__("rdx") = c;
  __asm__ volatile(".byte 0x0f, 0x05" : "=a"(result) : "a"(number), "r"(rdi), "r"(rsi), "r"(rdx)
                   : "rcx", "r11", "memory");
  return result;
}

static void try_execve(void) {
  char marker[512], command[600];
  path_in(marker, sizeof marker, "ASTRA_SELFTEST_WRITABLE", "exec-ran");
  snprintf(command, sizeof command, "echo ran > %s", marker);
  char *argv[] = {"/bin/sh", "-c", command, NULL};
  execve("/bin/sh", argv, environ); /* a program that proves it ran: its marker */
  note("execve_shell", 0, errno, "/bin/sh");
  char *true_argv[] = {"/bin/true", NULL};
  execve("/bin/true", true_argv, environ); /* had it run, the worker would be gone: no report at all */
  note("execve", 0, errno, "/bin/true");
}

static void try_raw_mkdir(void) {
  char dir[512];
  path_in(dir, sizeof dir, "ASTRA_SELFTEST_OUTSIDE", "raw-mkdir");
  long made = raw_syscall3(SYS_mkdir, (long)dir, 0755, 0);
  note("raw_syscall_mkdir", made == 0, made < 0 ? (int)-made : 0, dir);
}

static void try_raw_execve(void) {
  char marker[512], command[600];
  path_in(marker, sizeof marker, "ASTRA_SELFTEST_WRITABLE", "raw-exec-ran");
  snprintf(command, sizeof command, "echo ran > %s", marker);
  char *argv[] = {"/bin/sh", "-c", command, NULL};
  long ran = raw_syscall3(SYS_execve, (long)"/bin/sh", (long)argv, (long)environ);
  note("raw_syscall_execve", 0, ran < 0 ? (int)-ran : 0, "/bin/sh");
}

static sigjmp_buf int80_jump;
static void int80_fault(int sig) { siglongjmp(int80_jump, sig); }

/* The i386 system call table through `int 0x80` (mkdir is 39 there), which a filter written for
 * x86_64 numbers alone would not see. The path must sit below 4 GiB. */
static void try_int80(void) {
  char *low = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
  if (low == MAP_FAILED) {
    note("int80_mkdir", 0, errno, "no_low_memory");
    return;
  }
  path_in(low, 4096, "ASTRA_SELFTEST_OUTSIDE", "int80-mkdir");
  struct sigaction fault = {0}, old_segv, old_ill;
  fault.sa_handler = int80_fault;
  sigaction(SIGSEGV, &fault, &old_segv);
  sigaction(SIGILL, &fault, &old_ill);
  int sig = sigsetjmp(int80_jump, 1);
  if (sig == 0) {
    long result;
    __asm__ volatile("int $0x80" : "=a"(result) : "a"(39L), "b"((long)low), "c"(0755L) : "memory");
    note("int80_mkdir", result == 0, result < 0 ? (int)-result : 0, low);
  } else {
    note("int80_mkdir", 0, 0, "faulted:no_i386_entry");
  }
  sigaction(SIGSEGV, &old_segv, NULL);
  sigaction(SIGILL, &old_ill, NULL);
  munmap(low, 4096);
}

static void try_write_outside(void) {
  char file[512];
  path_in(file, sizeof file, "ASTRA_SELFTEST_OUTSIDE", "written");
  int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    note("write_outside", 0, errno, file);
    return;
  }
  ssize_t n = write(fd, "escaped\n", 8);
  close(fd);
  note("write_outside", n == 8, n == 8 ? 0 : errno, file);
}

static void try_read_secret(void) {
  char buf[80] = {0};
  int fd = open(env("ASTRA_SELFTEST_SECRET"), O_RDONLY);
  if (fd < 0) {
    note("read_secret", 0, errno, "");
    return;
  }
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  note("read_secret", n > 0, n > 0 ? 0 : errno, buf); /* the secret itself, if it could be read */
}

static void try_connect(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    note("connect_tcp", 0, errno, "socket");
    return;
  }
  struct sockaddr_in to = {0};
  to.sin_family = AF_INET;
  to.sin_port = htons((unsigned short)atoi(env("ASTRA_SELFTEST_PORT")));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int done = connect(fd, (struct sockaddr *)&to, sizeof to);
  int err = errno;
  if (done == 0) send(fd, "escaped\n", 8, 0);
  close(fd);
  note("connect_tcp", done == 0, done == 0 ? 0 : err, "connect");
}

static void try_dlopen(const char *action, const char *path, const char *how) {
  setenv("ASTRA_SELFTEST_HOW", how, 1);
  setenv("ASTRA_SELFTEST_PHASE", phase, 1);
  errno = 0;
  void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  const char *why = handle ? "loaded" : dlerror();
  note(action, handle != NULL, errno, why);
}

/* This library's own bytes, read from its file (readable: it is the module the worker loads). */
static ssize_t own_bytes(char **out) {
  int fd = open(env("ASTRA_SELFTEST_SELF"), O_RDONLY);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return -1;
  }
  char *data = malloc(st.st_size);
  ssize_t n = data ? read(fd, data, st.st_size) : -1;
  close(fd);
  *out = data;
  return n;
}

static void try_written_library(void) {
  char copy[512];
  snprintf(copy, sizeof copy, "%s/copy-%s.so", env("ASTRA_SELFTEST_WRITABLE"), phase);
  char *data = NULL;
  ssize_t n = own_bytes(&data);
  int fd = open(copy, O_WRONLY | O_CREAT | O_TRUNC, 0755);
  if (fd < 0 || n <= 0) {
    note("dlopen_written", 0, errno, "could_not_write");
    if (fd >= 0) close(fd);
    free(data);
    return;
  }
  ssize_t w = write(fd, data, n);
  close(fd);
  (void)w;
  try_dlopen("dlopen_written", copy, "written");
  /* the same file through its descriptor, the way a loader of an fd would */
  int ro = open(copy, O_RDONLY);
  note("read_written", ro >= 0, ro >= 0 ? 0 : errno, copy);
  if (ro >= 0) close(ro);
  free(data);
}

/* "/proc/self/fd/N" for a duplicate of `fd` numbered from `base` (one number per phase): the loader
 * knows a library by its path, and would hand back an earlier one loaded under the same name. */
static void fd_path(char *out, size_t size, int fd, int base) {
  int high = fcntl(fd, F_DUPFD_CLOEXEC, base + (strcmp(phase, "call") == 0 ? 50 : 0));
  snprintf(out, size, "/proc/self/fd/%d", high >= 0 ? high : fd);
}

/* Write this library's bytes into `fd` and load it through /proc/self/fd; `fd` is closed. */
static void load_through_fd(const char *action, const char *how, int fd, int base) {
  char *data = NULL;
  ssize_t n = own_bytes(&data);
  if (n > 0 && write(fd, data, n) == n) {
    char path[64];
    fd_path(path, sizeof path, fd, base);
    try_dlopen(action, path, how);
  } else {
    note(action, 0, errno, "write");
  }
  free(data);
  close(fd);
}

static void try_memfd(void) {
  int fd = (int)syscall(SYS_memfd_create, "astra-selftest", 0);
  if (fd < 0)
    note("memfd_dlopen", 0, errno, "memfd_create");
  else
    load_through_fd("memfd_dlopen", "memfd", fd, 300);
}

/* An unnamed file in the writable directory, then mapped through /proc/self/fd: a re-open Landlock
 * checks against the directory the file lives in. */
static void try_tmpfile(void) {
  int fd = open(env("ASTRA_SELFTEST_WRITABLE"), O_TMPFILE | O_WRONLY, 0700);
  if (fd < 0)
    note("tmpfile_dlopen", 0, errno, "O_TMPFILE");
  else
    load_through_fd("tmpfile_dlopen", "tmpfile", fd, 400);
}

static void try_fork(void) {
  pid_t child = fork();
  if (child == 0) {
    char marker[512];
    path_in(marker, sizeof marker, "ASTRA_SELFTEST_WRITABLE", "fork-ran");
    int fd = open(marker, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
    _exit(0);
  }
  if (child > 0) waitpid(child, NULL, 0);
  note("fork", child > 0, child < 0 ? errno : 0, "");
}

static void try_kill_parent(void) {
  int done = kill(getppid(), SIGUSR2);
  note("kill_parent", done == 0, done == 0 ? 0 : errno, "SIGUSR2");
}

static void try_ptrace_parent(void) {
  long done = ptrace(PTRACE_SEIZE, getppid(), NULL, NULL);
  int err = errno;
  if (done == 0) ptrace(PTRACE_DETACH, getppid(), NULL, NULL);
  note("ptrace_parent", done == 0, done == 0 ? 0 : err, "PTRACE_SEIZE");
}

static void try_io_uring(void) {
  char params[120] = {0}; /* struct io_uring_params, zeroed */
  long fd = syscall(SYS_io_uring_setup, 4, params);
  note("io_uring", fd >= 0, fd >= 0 ? 0 : errno, "io_uring_setup");
  if (fd >= 0) close((int)fd);
}

static void try_unshare(void) {
  int done = unshare(CLONE_NEWUSER | CLONE_NEWNS);
  note("unshare", done == 0, done == 0 ? 0 : errno, "CLONE_NEWUSER|CLONE_NEWNS");
}

/* Only inside a call: by then the worker has locked executable mappings (stage 2). */
static void try_exec_mappings(void) {
  void *rwx = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  note("mmap_exec", rwx != MAP_FAILED, rwx == MAP_FAILED ? errno : 0, "anonymous_rwx");
  if (rwx != MAP_FAILED) munmap(rwx, 4096);
  void *rw = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (rw == MAP_FAILED) return;
  int done = mprotect(rw, 4096, PROT_READ | PROT_EXEC);
  note("mprotect_exec", done == 0, done == 0 ? 0 : errno, "rw_to_rx");
  munmap(rw, 4096);
}

static void try_other_library(void) { try_dlopen("dlopen_outside", env("ASTRA_SELFTEST_OTHER"), "other"); }

static void try_everything(void) {
  static const struct {
    const char *name;
    void (*attempt)(void);
  } attempts[] = {
      {"raw_syscall_mkdir", try_raw_mkdir}, {"int80_mkdir", try_int80},     {"write_outside", try_write_outside},
      {"read_secret", try_read_secret},   {"connect_tcp", try_connect},     {"dlopen_outside", try_other_library},
      {"dlopen_written", try_written_library}, {"memfd_dlopen", try_memfd}, {"tmpfile_dlopen", try_tmpfile},
      {"fork", try_fork},                 {"kill_parent", try_kill_parent}, {"ptrace_parent", try_ptrace_parent},
      {"io_uring", try_io_uring},         {"unshare", try_unshare},
      {"raw_syscall_execve", try_raw_execve}, /* these two last: had one been allowed, nothing after it ran */
      {"execve", try_execve},
  };
  for (size_t i = 0; i < sizeof attempts / sizeof attempts[0]; ++i)
    if (!skipped(attempts[i].name)) attempts[i].attempt();
}

__attribute__((constructor)) static void astra_selftest_constructor(void) {
  if (getenv("ASTRA_SELFTEST_NESTED")) { /* a copy loaded by one of the attempts: leave a marker */
    char marker[512];
    snprintf(marker, sizeof marker, "%s/nested-%s-%s", env("ASTRA_SELFTEST_WRITABLE"), env("ASTRA_SELFTEST_HOW"),
             env("ASTRA_SELFTEST_PHASE"));
    int fd = open(marker, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
    return;
  }
  setenv("ASTRA_SELFTEST_NESTED", "1", 1);
  phase = "constructor";
  try_everything();
}

int astra_selftest_call(void) {
  phase = "call";
  try_exec_mappings();
  try_everything();
  return n_records;
}

/* The records as text, one per line, into `out` (at most `size` bytes); returns the bytes written. */
int astra_selftest_report(char *out, int size) {
  int used = 0;
  for (int i = 0; i < n_records && used < size; ++i) {
    struct record *r = &records[i];
    used += snprintf(out + used, size - used, "%s %s did=%d errno=%d %s\n", r->phase, r->action, r->did, r->err,
                     r->detail[0] ? r->detail : "-");
  }
  return used < size ? used : size;
}
