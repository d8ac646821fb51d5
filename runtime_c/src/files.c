/* Reading package files, and the private copies libraries are loaded from. */
#define _GNU_SOURCE
#include "files.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sha256.h"

edgecv_status ec_read_file(const char *path, const char *what, unsigned char **data,
                           size_t *size, edgecv_error **error) {
  *data = NULL;
  *size = 0;
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    int missing = errno == ENOENT || errno == ENOTDIR;
    return ec_fail(error, missing ? EDGECV_E_NOT_FOUND : EDGECV_E_IO, "cannot read %s %s: %s%s",
                   what, path, strerror(errno), missing ? "; redeploy the model" : "");
  }
  struct stat info;
  if (fstat(fileno(file), &info) != 0 || !S_ISREG(info.st_mode)) {
    fclose(file);
    return ec_fail(error, EDGECV_E_IO, "cannot read %s %s: it is not a regular file", what, path);
  }
  size_t capacity = (size_t)info.st_size + 1, n = 0;
  unsigned char *buffer = malloc(capacity);
  if (buffer == NULL) {
    fclose(file);
    return ec_fail(error, EDGECV_E_MEMORY, "cannot read %s %s: out of memory (%zu bytes)", what,
                   path, capacity);
  }
  for (;;) {
    n += fread(buffer + n, 1, capacity - 1 - n, file);
    if (n < capacity - 1 || feof(file)) break;
    /* the file grew while read: read on */
    unsigned char *grown = realloc(buffer, capacity * 2);
    if (grown == NULL) break;
    buffer = grown;
    capacity *= 2;
  }
  int failed = ferror(file);
  fclose(file);
  if (failed) {
    free(buffer);
    return ec_fail(error, EDGECV_E_IO, "cannot read %s %s: a read failed", what, path);
  }
  buffer[n] = '\0';
  *data = buffer;
  *size = n;
  return EDGECV_OK;
}

int ec_inside_package(const char *relative, size_t length) {
  if (length == 0 || relative[0] == '/' || relative[0] == '\\') return 0;
  if (length >= 2 && relative[1] == ':' &&
      ((relative[0] >= 'A' && relative[0] <= 'Z') || (relative[0] >= 'a' && relative[0] <= 'z'))) {
    return 0;
  }
  for (size_t i = 0; i < length; i++) {
    unsigned char c = (unsigned char)relative[i];
    if (c < 0x20 || c == 0x7f) return 0;
  }
  for (size_t start = 0; start <= length;) { /* no ".." part */
    size_t end = start;
    while (end < length && relative[end] != '/') end++;
    if (end - start == 2 && relative[start] == '.' && relative[start + 1] == '.') return 0;
    start = end + 1;
  }
  return 1;
}

static pthread_mutex_t private_lock = PTHREAD_MUTEX_INITIALIZER;
static char private_folder[PATH_MAX];
static pid_t private_pid = 0;

static void remove_private_folder(void) {
  if (private_pid == getpid()) rmdir(private_folder);
}

edgecv_status ec_private_copy(const char *name, const void *data, size_t size, char **path,
                              edgecv_error **error) {
  char digest[65], folder[PATH_MAX], target[PATH_MAX], partial[PATH_MAX];
  *path = NULL;
  sha256_of(data, size, digest);
  pthread_mutex_lock(&private_lock);
  if (private_pid != getpid()) { /* a forked child makes its own */
    const char *tmp = getenv("TMPDIR");
    snprintf(private_folder, sizeof private_folder, "%s/edgecv-kernels-XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(private_folder) == NULL) {
      int saved = errno;
      pthread_mutex_unlock(&private_lock);
      return ec_fail(error, EDGECV_E_IO,
                     "cannot make a private folder to load the package's libraries from (%s): "
                     "%s; set TMPDIR to a writable folder",
                     private_folder, strerror(saved));
    }
    if (private_pid == 0) atexit(remove_private_folder);
    private_pid = getpid();
  }
  edgecv_status status = EDGECV_OK;
  int n1 = snprintf(folder, sizeof folder, "%s/%.32s", private_folder, digest);
  int n2 = snprintf(target, sizeof target, "%s/%s", folder, name);
  int n3 = snprintf(partial, sizeof partial, "%s/%s.part", folder, name);
  if (n1 < 0 || n2 < 0 || n3 < 0 || (size_t)n3 >= sizeof partial) {
    status = ec_fail(error, EDGECV_E_IO, "the private folder %s is too deep: set TMPDIR to a "
                     "shorter path", private_folder);
  } else if (mkdir(folder, 0700) != 0 && errno != EEXIST) {
    status = ec_fail(error, EDGECV_E_IO, "cannot make %s: %s", folder, strerror(errno));
  } else {
    FILE *file = fopen(partial, "wb");
    int written = file != NULL && fwrite(data, 1, size, file) == size;
    if (file != NULL && fclose(file) != 0) written = 0;
    if (!written || rename(partial, target) != 0) {
      status = ec_fail(error, EDGECV_E_IO, "cannot write the private copy %s of %s: %s", target,
                       name, strerror(errno));
      unlink(partial);
    }
  }
  pthread_mutex_unlock(&private_lock);
  if (status == EDGECV_OK) {
    *path = strdup(target);
    if (*path == NULL) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
  }
  return status;
}

void ec_private_remove(const char *path) {
  if (path == NULL) return;
  pthread_mutex_lock(&private_lock);
  unlink(path);
  char folder[PATH_MAX];
  snprintf(folder, sizeof folder, "%s", path);
  char *slash = strrchr(folder, '/');
  if (slash != NULL) {
    *slash = '\0';
    rmdir(folder); /* fails, harmlessly, while another copy of these bytes is there */
  }
  pthread_mutex_unlock(&private_lock);
}
