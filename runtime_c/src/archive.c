/* Package archives read in memory (see archive.h): gzip through zlib, tar by hand. */
#define _POSIX_C_SOURCE 200809L
#include "archive.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "files.h"

#define BLOCK 512

int ec_is_archive_name(const char *path) {
  size_t n = strlen(path);
  return (n > 7 && !strcmp(path + n - 7, ".tar.gz")) || (n > 4 && !strcmp(path + n - 4, ".tgz"));
}

/* The package folder an archive holds: its file name without .tar.gz or .tgz. */
static void folder_of(const char *path, char *folder, size_t size) {
  const char *name = strrchr(path, '/');
  name = name ? name + 1 : path;
  size_t n = strlen(name);
  n -= n > 7 && !strcmp(name + n - 7, ".tar.gz") ? 7 : 4;
  snprintf(folder, size, "%.*s", (int)n, name);
}

static edgecv_status gunzip(const char *path, const unsigned char *data, size_t size,
                            ec_archive *archive, edgecv_error **error) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
  size_t capacity = size * 4 + BLOCK, n = 0;
  unsigned char *out = malloc(capacity);
  int result = out ? Z_OK : Z_MEM_ERROR;
  z.next_in = (unsigned char *)data;
  while (result == Z_OK) {
    if (n == capacity) {
      unsigned char *grown = capacity < ((size_t)1 << 40) ? realloc(out, capacity * 2) : NULL;
      if (grown == NULL) {
        result = Z_MEM_ERROR;
        break;
      }
      out = grown;
      capacity *= 2;
    }
    size_t left = size - (size_t)(z.next_in - data);
    z.avail_in = (uInt)(left > (1u << 30) ? 1u << 30 : left);
    z.next_out = out + n;
    z.avail_out = (uInt)(capacity - n > (1u << 30) ? 1u << 30 : capacity - n);
    size_t before = z.avail_out;
    result = inflate(&z, Z_NO_FLUSH);
    n += before - z.avail_out;
    if (result == Z_BUF_ERROR && z.avail_out > 0) break; /* the input ended early */
    if (result == Z_BUF_ERROR) result = Z_OK;
  }
  const char *why = result == Z_MEM_ERROR ? "out of memory" : z.msg ? z.msg : "it ends early";
  inflateEnd(&z);
  if (result != Z_STREAM_END) {
    free(out);
    return ec_fail(error, result == Z_MEM_ERROR ? EDGECV_E_MEMORY : EDGECV_E_ARCHIVE,
                   "%s is not a readable package archive (gzip: %s); copy the package again",
                   path, why);
  }
  archive->tar = out;
  archive->tar_size = n;
  return EDGECV_OK;
}

static size_t octal(const unsigned char *field, size_t length, int *ok) {
  size_t value = 0, i = 0;
  while (i < length && field[i] == ' ') i++;
  for (; i < length && field[i] >= '0' && field[i] <= '7'; i++) {
    if (value > ((size_t)-1 >> 3)) *ok = 0;
    value = value << 3 | (size_t)(field[i] - '0');
  }
  if (i < length && field[i] != '\0' && field[i] != ' ') *ok = 0;
  return value;
}

/* A member's name in its own buffer: ustar's prefix and name, or a longer one given. */
static void member_name(const unsigned char *h, const char *given, char *name, size_t size) {
  if (given[0] != '\0') {
    snprintf(name, size, "%s", given);
  } else if (h[345] != '\0' && !memcmp(h + 257, "ustar", 5)) {
    snprintf(name, size, "%.155s/%.100s", (const char *)h + 345, (const char *)h);
  } else {
    snprintf(name, size, "%.100s", (const char *)h);
  }
}

/* Why the member `name` may not be in a package archive, NULL when it may; its name
 * relative to the package folder in `relative`. */
static const char *refused(const char *name, char type, const char *folder, char *relative,
                           size_t size) {
  if (name[0] == '/' || name[0] == '\\' || (name[0] && name[1] == ':')) return "has an absolute path";
  relative[0] = '\0';
  size_t parts = 0, at = 0;
  for (const char *p = name; *p;) {
    size_t n = strcspn(p, "/");
    if (n == 2 && !strncmp(p, "..", 2)) return "climbs out with `..`";
    if (n > 0 && !(n == 1 && p[0] == '.')) {
      if (parts == 0 && (strlen(folder) != n || strncmp(p, folder, n) != 0)) return "lies outside the package folder";
      if (parts > 0) at += (size_t)snprintf(relative + at, at < size ? size - at : 0, "%s%.*s", at ? "/" : "", (int)n, p);
      parts++;
    }
    p += n + (p[n] == '/');
  }
  if (parts == 0) return "lies outside the package folder";
  if (type == '1' || type == '2') return "is a link, and a package archive holds only files and folders";
  if (type != '0' && type != '\0' && type != '5' && type != '7') return "is a device, pipe or other special file";
  return NULL;
}

/* pax's "path" and "size" records, where a member's header cannot hold them */
static void pax_records(const unsigned char *data, size_t size, char *path, size_t path_size,
                        size_t *member_size, int *has_size) {
  for (size_t at = 0; at < size;) {
    char *end;
    unsigned long length = strtoul((const char *)data + at, &end, 10);
    if (length == 0 || length > size - at || (const unsigned char *)end >= data + at + length) return;
    const char *record = end + 1, *stop = (const char *)data + at + length - 1;
    if (!strncmp(record, "path=", 5)) snprintf(path, path_size, "%.*s", (int)(stop - record - 5), record + 5);
    if (!strncmp(record, "size=", 5)) {
      *member_size = (size_t)strtoull(record + 5, NULL, 10);
      *has_size = 1;
    }
    at += length;
  }
}

static edgecv_status members(const char *path, ec_archive *archive, edgecv_error **error) {
  char folder[256], given[4096] = "", name[4096], relative[4096];
  folder_of(path, folder, sizeof folder);
  size_t at = 0, pax_size = 0;
  int has_pax_size = 0;
  archive->members = calloc(archive->tar_size / BLOCK + 1, sizeof *archive->members);
  if (archive->members == NULL) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
  while (at + BLOCK <= archive->tar_size) {
    const unsigned char *h = archive->tar + at;
    int empty = 1, ok = 1;
    for (int i = 0; i < BLOCK && empty; i++) empty = h[i] == 0;
    if (empty) break; /* the end blocks */
    unsigned sum = 0;
    for (int i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? ' ' : h[i];
    size_t size = octal(h + 124, 12, &ok);
    if (!ok || octal(h + 148, 8, &ok) != sum || !ok) {
      return ec_fail(error, EDGECV_E_ARCHIVE,
                     "%s is not a readable package archive: a damaged tar header at byte %zu; "
                     "copy the package again", path, at);
    }
    char type = (char)h[156];
    if (has_pax_size && type != 'x' && type != 'g') size = pax_size;
    if (size > archive->tar_size - at - BLOCK) {
      return ec_fail(error, EDGECV_E_ARCHIVE,
                     "%s is not a readable package archive: a member reaches past its end (a "
                     "truncated file); copy the package again", path);
    }
    const unsigned char *data = h + BLOCK;
    at += BLOCK + (size + BLOCK - 1) / BLOCK * BLOCK;
    if (type == 'x' || type == 'L' || type == 'g') { /* the next member's long name or size */
      if (type == 'x') pax_records(data, size, given, sizeof given, &pax_size, &has_pax_size);
      if (type == 'L') snprintf(given, sizeof given, "%.*s", (int)(size < sizeof given ? size : sizeof given - 1), data);
      continue;
    }
    member_name(h, given, name, sizeof name);
    given[0] = '\0';
    has_pax_size = 0;
    const char *why = refused(name, type, folder, relative, sizeof relative);
    if (why != NULL) {
      char shown[200];
      int outside = !strcmp(why, "lies outside the package folder");
      return ec_fail(error, EDGECV_E_ARCHIVE,
                     "%s is not a safe package archive: member `%s` %s%s%s%s; nothing of it was "
                     "used", path, ec_shown(shown, sizeof shown, name, strlen(name), 120), why,
                     outside ? " `" : "", outside ? folder : "", outside ? "/`" : "");
    }
    if (type == '5' || relative[0] == '\0') continue; /* a folder */
    ec_member *m = &archive->members[archive->count++];
    m->name = strdup(relative);
    if (m->name == NULL) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
    m->data = data;
    m->size = size;
  }
  return EDGECV_OK;
}

edgecv_status ec_archive_read(const char *path, ec_archive *archive, edgecv_error **error) {
  memset(archive, 0, sizeof *archive);
  unsigned char *data = NULL;
  size_t size = 0;
  edgecv_status status = ec_read_file(path, "package archive", &data, &size, error);
  if (status == EDGECV_OK) status = gunzip(path, data, size, archive, error);
  free(data);
  if (status == EDGECV_OK) status = members(path, archive, error);
  if (status != EDGECV_OK) ec_archive_free(archive);
  return status;
}

const ec_member *ec_archive_member(const ec_archive *archive, const char *relative) {
  const ec_member *found = NULL; /* the last of a name, as tar extracts it */
  for (size_t i = 0; i < archive->count; i++) {
    if (!strcmp(archive->members[i].name, relative)) found = &archive->members[i];
  }
  return found;
}

void ec_archive_free(ec_archive *archive) {
  for (size_t i = 0; i < archive->count; i++) free(archive->members[i].name);
  free(archive->members);
  free(archive->tar);
  memset(archive, 0, sizeof *archive);
}
