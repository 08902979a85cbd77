/* The self-test's "other library": a shared library outside the worker's allow-list. The payload
 * (payload.c) tries to dlopen it; had that worked, this constructor would have left a marker in the
 * worker's writable directory, named after the phase that loaded it. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void astra_selftest_other(void) {
  const char *dir = getenv("ASTRA_SELFTEST_WRITABLE");
  const char *phase = getenv("ASTRA_SELFTEST_PHASE");
  char marker[512];
  snprintf(marker, sizeof marker, "%s/other-ran-%s", dir ? dir : ".", phase ? phase : "unknown");
  int fd = open(marker, O_WRONLY | O_CREAT, 0644);
  if (fd >= 0) close(fd);
}
