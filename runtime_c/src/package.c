/* Opening a package folder and checking every file (see package.h). */
#define _POSIX_C_SOURCE 200809L
#include "package.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "archive.h"
#include "files.h"
#include "manifest.h"
#include "sha256.h"

static char *joined(const char *root, const char *relative) {
  size_t n = strlen(root) + strlen(relative) + 2;
  char *path = malloc(n);
  if (path != NULL) snprintf(path, n, "%s/%s", root, relative);
  return path;
}

void ec_bytes_drop(ec_bytes *bytes) {
  free(bytes->data);
  bytes->data = NULL;
  bytes->size = 0;
}

static edgecv_status check_pin(const char *pin, char lower[65], edgecv_error **error) {
  size_t n = strlen(pin), start = 0;
  while (start < n && isspace((unsigned char)pin[start])) start++;
  while (n > start && isspace((unsigned char)pin[n - 1])) n--;
  int ok = n - start == 64;
  for (size_t i = 0; ok && i < 64; i++) {
    char c = (char)tolower((unsigned char)pin[start + i]);
    ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    lower[i] = c;
  }
  lower[64] = '\0';
  if (ok) return EDGECV_OK;
  char shown[100];
  return ec_fail(error, EDGECV_E_ARGUMENT,
                 "sha256 '%s' is not a package pin: give the 64 hex digits `edgecv deploy` "
                 "printed (the sha256 of the package's manifest.json)",
                 ec_shown(shown, sizeof shown, pin, strlen(pin), 80));
}

/* Where the package's files are: its folder, or an archive read in memory. */
typedef struct {
  const char *root;
  const ec_archive *archive; /* NULL for a folder */
} source;

static int source_has(const source *from, const char *relative) {
  if (from->archive != NULL) return ec_archive_member(from->archive, relative) != NULL;
  char *path = joined(from->root, relative);
  struct stat info;
  int found = path != NULL && stat(path, &info) == 0 && S_ISREG(info.st_mode);
  free(path);
  return found;
}

static edgecv_status source_read(const source *from, const char *relative, const char *what,
                                 ec_bytes *bytes, edgecv_error **error) {
  if (from->archive == NULL) {
    char *path = joined(from->root, relative);
    if (path == NULL) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
    edgecv_status status = ec_read_file(path, what, &bytes->data, &bytes->size, error);
    free(path);
    return status;
  }
  const ec_member *member = ec_archive_member(from->archive, relative);
  bytes->data = malloc(member->size + 1);
  if (bytes->data == NULL) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
  memcpy(bytes->data, member->data, member->size);
  bytes->data[member->size] = '\0';
  bytes->size = member->size;
  return EDGECV_OK;
}

/* The sha256 of a file the loader does not read, hashed as it streams. */
static int file_digest(const char *path, char hex[65]) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) return 0;
  sha256_context context;
  sha256_init(&context);
  unsigned char chunk[1 << 16];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, file)) > 0) sha256_update(&context, chunk, n);
  int ok = !ferror(file);
  fclose(file);
  sha256_hex(&context, hex);
  return ok;
}

/* The bytes kept for `relative`, where the loader reads it; NULL for another file. */
static ec_bytes *kept_for(ec_package *package, const char *relative) {
  if (!strcmp(relative, "plan.json")) return &package->plan;
  if (!strcmp(relative, "params.npz")) return &package->params;
  const char *keys[] = {"cpu", "tvm_runtime", "tvm_runtime_extra"};
  ec_bytes *kept[] = {&package->cpu, &package->tvm_runtime, &package->tvm_runtime_extra};
  for (int k = 0; k < 3; k++) {
    const char *file = ec_manifest_kernel(package->manifest, keys[k]);
    if (file != NULL && !strcmp(file, relative)) return kept[k];
  }
  return NULL;
}

static edgecv_status check_files(ec_package *package, const source *from, const char *where,
                                 edgecv_error **error) {
  const json_value *files = json_get(package->manifest, "files");
  const json_value *kernels = json_path(package->manifest, "build.kernels");
  /* every file the loader reads is listed: plan, params, every kernel file */
  size_t loaded = 2 + kernels->as.object.count;
  for (size_t i = 0; i < loaded; i++) {
    const char *relative = i == 0 ? "plan.json" : i == 1 ? "params.npz"
                         : kernels->as.object.members[i - 2].value->as.string.text;
    if (json_get(files, relative) == NULL) {
      return ec_fail(error, EDGECV_E_MANIFEST,
                     "%s lists no checksum for %s, which the loader reads; the manifest is "
                     "damaged: redeploy the model",
                     where, relative);
    }
  }
  for (size_t i = 0; i < files->as.object.count; i++) {
    const json_member *file = &files->as.object.members[i];
    if (json_get(files, file->key) != file->value) continue; /* a duplicate key: the last counts */
    char *path = joined(package->root, file->key), hex[65];
    if (path == NULL) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
    if (!source_has(from, file->key)) {
      free(path);
      return ec_fail(error, EDGECV_E_NOT_FOUND, "package %s is missing %s; redeploy the model",
                     package->root, file->key);
    }
    ec_bytes *kept = kept_for(package, file->key);
    const ec_member *member = from->archive ? ec_archive_member(from->archive, file->key) : NULL;
    edgecv_status status = EDGECV_OK;
    if (kept != NULL) {
      ec_bytes_drop(kept);
      status = source_read(from, file->key, "package file", kept, error);
      if (status == EDGECV_OK) sha256_of(kept->data, kept->size, hex);
    } else if (member != NULL) {
      sha256_of(member->data, member->size, hex);
    } else if (!file_digest(path, hex)) {
      status = ec_fail(error, EDGECV_E_IO, "cannot read package file %s: %s", path, strerror(errno));
    }
    if (status == EDGECV_OK && strcmp(hex, file->value->as.string.text) != 0) {
      status = ec_fail(error, EDGECV_E_CHECKSUM,
                       "package file %s is corrupt (checksum mismatch: sha256 %s, the manifest "
                       "lists %s); redeploy the model or copy the package again",
                       path, hex, file->value->as.string.text);
    }
    free(path);
    if (status != EDGECV_OK) return status;
  }
  return EDGECV_OK;
}

edgecv_status ec_package_open(const char *path, const char *pin, ec_package *package,
                              edgecv_error **error) {
  memset(package, 0, sizeof *package);
  char wanted[65] = "";
  if (pin != NULL && check_pin(pin, wanted, error) != EDGECV_OK) return EDGECV_E_ARGUMENT;
  struct stat info;
  if (stat(path, &info) != 0) {
    return ec_fail(error, EDGECV_E_NOT_FOUND,
                   "package %s does not exist; create one with `edgecv deploy`", path);
  }
  ec_archive archive = {0};
  source from = {path, NULL};
  edgecv_status status = EDGECV_OK;
  if (S_ISREG(info.st_mode) && ec_is_archive_name(path)) {
    status = ec_archive_read(path, &archive, error);
    from.archive = &archive;
  }
  package->root = strdup(path);
  char *where = joined(path, EC_MANIFEST);
  if (status == EDGECV_OK && (package->root == NULL || where == NULL)) {
    status = ec_fail(error, EDGECV_E_MEMORY, "out of memory");
  }
  ec_bytes manifest = {0};
  if (status == EDGECV_OK && !source_has(&from, EC_MANIFEST)) {
    status = ec_fail(error, EDGECV_E_NOT_FOUND, "%s is not an edgecv package: %s is missing", path,
                     EC_MANIFEST);
  } else if (status == EDGECV_OK) {
    status = source_read(&from, EC_MANIFEST, "the manifest", &manifest, error);
  }
  unsigned char *text = manifest.data;
  size_t size = manifest.size;
  if (status == EDGECV_OK) {
    sha256_of(text, size, package->sha256);
    if (pin != NULL && strcmp(package->sha256, wanted) != 0) {
      status = ec_fail(error, EDGECV_E_PIN,
                       "%s is not the pinned package: its manifest has sha256 %s, the pin "
                       "expects %s; load the package the pin was printed for (its manifest lists "
                       "every file's sha256, so any change to the package changes it)",
                       path, package->sha256, wanted);
    }
  }
  if (status == EDGECV_OK) {
    char why[300];
    package->manifest = json_parse((const char *)text, size, why, sizeof why);
    if (package->manifest == NULL) {
      status = ec_fail(error, EDGECV_E_MANIFEST,
                       "%s is corrupt (%s); redeploy the model or copy the package again", where, why);
    }
  }
  free(text);
  if (status == EDGECV_OK) status = ec_manifest_check(package->manifest, path, where, error);
  if (status == EDGECV_OK) status = check_files(package, &from, where, error);
  free(where);
  ec_archive_free(&archive);
  return status;
}

void ec_package_close(ec_package *package) {
  free(package->root);
  json_free(package->manifest);
  ec_bytes *kept[] = {&package->plan, &package->params, &package->cpu, &package->tvm_runtime,
                      &package->tvm_runtime_extra};
  for (int k = 0; k < 5; k++) ec_bytes_drop(kept[k]);
  memset(package, 0, sizeof *package);
}
