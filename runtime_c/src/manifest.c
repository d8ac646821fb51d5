/* The manifest's field-by-field check (see manifest.h). */
#include "manifest.h"

#include <stdio.h>
#include <string.h>

#include "dtype.h"
#include "files.h"

#ifndef EDGECV_VERSION
#error "EDGECV_VERSION must be defined (CMake reads it from edgecv/board/_version.py)"
#endif

/* The shared libraries the loader opens, by their key in build.kernels: each is always
 * this file (the Python loader's LIBRARY_FILES) */
static const char *const LIBRARY_KEYS[] = {"cpu", "tvm_runtime", "tvm_runtime_extra"};
static const char *const LIBRARY_FILES[] = {"kernels/cpu.so", "kernels/libtvm_runtime.so",
                                            "kernels/libtvm_runtime_extra.so"};
#define LIBRARIES 3

#define KIND(k) (1u << (k))
#define NUMBER (KIND(JSON_INT) | KIND(JSON_FLOAT))

typedef struct {
  const json_value *manifest;
  const char *where;
  edgecv_error **error;
  edgecv_status status;
} fields;

static void fail(fields *f, const char *path, const char *expected, const json_value *found) {
  if (f->status != EDGECV_OK) return;
  char shown[200];
  json_render(found, shown, sizeof shown, 60);
  f->status = ec_fail(f->error, EDGECV_E_MANIFEST,
                      "%s: field `%s` should be %s, found %s%s%s; the manifest is damaged or "
                      "from another tool: redeploy the model",
                      f->where, path, expected, found ? json_kind_name(found) : "nothing",
                      found ? " " : "", found ? shown : "");
}

static const char *kinds_named(unsigned kinds, char *buffer, size_t size) {
  static const char *names[] = {"null", "bool", "int", "float", "str", "list", "dict"};
  size_t at = (size_t)snprintf(buffer, size, "a ");
  int first = 1;
  for (int k = 0; k < 7; k++) {
    if (!(kinds & KIND(k))) continue;
    at += (size_t)snprintf(buffer + at, size - at, "%s%s", first ? "" : " or ", names[k]);
    first = 0;
  }
  return buffer;
}

/* The field at dotted `path`, of one of `kinds`; NULL where absent (refused when
 * required) or of another kind (refused). */
static const json_value *get(fields *f, const char *path, unsigned kinds, int required) {
  if (f->status != EDGECV_OK) return NULL;
  const json_value *v = json_path(f->manifest, path);
  if (v == NULL && !required) return NULL;
  if (v == NULL || !(kinds & KIND(v->kind))) {
    char expected[64];
    fail(f, path, kinds_named(kinds, expected, sizeof expected), v);
    return NULL;
  }
  return v;
}

static void strings(fields *f, const char *path, int required) {
  const json_value *v = get(f, path, KIND(JSON_ARRAY), required);
  for (size_t i = 0; v != NULL && i < v->as.array.count; i++) {
    if (v->as.array.items[i]->kind != JSON_STRING) {
      fail(f, path, "a list of strings", v);
      return;
    }
  }
}

static void tensor(fields *f, const char *list, size_t index) {
  char path[64];
  snprintf(path, sizeof path, "%s.%zu.name", list, index);
  get(f, path, KIND(JSON_STRING), 1);
  snprintf(path, sizeof path, "%s.%zu.shape", list, index);
  const json_value *shape = get(f, path, KIND(JSON_ARRAY), 1);
  for (size_t i = 0; shape != NULL && i < shape->as.array.count; i++) {
    const json_value *d = shape->as.array.items[i];
    if (d->kind != JSON_INT || d->as.integer < 0) {
      fail(f, path, "a list of sizes (whole numbers >= 0)", shape);
      return;
    }
  }
  snprintf(path, sizeof path, "%s.%zu.dtype", list, index);
  const json_value *dtype = get(f, path, KIND(JSON_STRING), 1);
  if (dtype != NULL && ec_dtype_named(dtype->as.string.text) == NULL) {
    char expected[200];
    snprintf(expected, sizeof expected, "a dtype this runtime knows (%s)", ec_dtype_names());
    fail(f, path, expected, dtype);
  }
}

static int is_digest(const json_value *v) {
  if (v == NULL || v->kind != JSON_STRING || v->as.string.length != 64) return 0;
  for (size_t i = 0; i < 64; i++) {
    char c = v->as.string.text[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
  }
  return 1;
}

static edgecv_status check_format(const json_value *m, const char *root, const char *where,
                                  edgecv_error **error) {
  char shown[200];
  if (m->kind != JSON_OBJECT) {
    return ec_fail(error, EDGECV_E_MANIFEST,
                   "%s holds a JSON %s, not an edgecv manifest; redeploy the model", where,
                   json_kind_name(m));
  }
  const json_value *format = json_get(m, "format");
  if (!json_is_string(format, EC_FORMAT)) {
    return ec_fail(error, EDGECV_E_MANIFEST, "%s is not an edgecv package (format %s)", root,
                   json_render(format ? format : &(json_value){JSON_NULL, {0}}, shown,
                               sizeof shown, 60));
  }
  const json_value *version = json_get(m, "format_version");
  if (version == NULL || version->kind != JSON_INT || version->as.integer != EC_FORMAT_VERSION) {
    return ec_fail(error, EDGECV_E_MANIFEST,
                   "%s has package format %s, this edgecv reads format %d; redeploy the model "
                   "with this edgecv",
                   root, json_render(version, shown, sizeof shown, 40), EC_FORMAT_VERSION);
  }
  const json_value *built = json_path(m, "versions.edgecv");
  if (!json_is_string(built, EDGECV_VERSION)) {
    return ec_fail(error, EDGECV_E_MANIFEST,
                   "%s was built by edgecv %s, this is edgecv %s; kernels and plans are not "
                   "portable across versions: redeploy the model",
                   root, json_render(built, shown, sizeof shown, 40), EDGECV_VERSION);
  }
  return EDGECV_OK;
}

static void check_relative(fields *f, const json_value *name, const char *field) {
  if (f->status != EDGECV_OK) return;
  if (!ec_inside_package(name->as.string.text, name->as.string.length)) {
    char shown[200];
    f->status = ec_fail(f->error, EDGECV_E_MANIFEST,
                        "%s: `%s` names %s, which is not a file inside the package; the "
                        "manifest is damaged: redeploy the model",
                        f->where, field, json_render(name, shown, sizeof shown, 80));
  }
}

static void check_build(fields *f) {
  const json_value *kernels = get(f, "build.kernels", KIND(JSON_OBJECT), 1);
  if (kernels != NULL && kernels->as.object.count == 0) {
    fail(f, "build.kernels", "the package's kernel files", kernels);
  }
  for (size_t i = 0; kernels != NULL && i < kernels->as.object.count; i++) {
    const json_member *m = &kernels->as.object.members[i];
    char field[160], shown[100];
    snprintf(field, sizeof field, "build.kernels.%s",
             ec_shown(shown, sizeof shown, m->key, m->key_length, 60));
    if (m->value->kind != JSON_STRING) {
      fail(f, field, "a file of the package", m->value);
      return;
    }
    check_relative(f, m->value, field);
    /* what the dynamic loader opens is named by the format, not by the manifest */
    const char *expected = NULL;
    int names_a_library = 0;
    for (int k = 0; k < LIBRARIES; k++) {
      if (strcmp(m->key, LIBRARY_KEYS[k]) == 0) expected = LIBRARY_FILES[k];
      if (json_is_string(m->value, LIBRARY_FILES[k])) names_a_library = 1;
    }
    if (expected != NULL ? !json_is_string(m->value, expected) : names_a_library) {
      char want[80];
      snprintf(want, sizeof want, "'%s'", expected ? expected : "");
      fail(f, field, expected ? want : "a file no other entry of build.kernels names", m->value);
    }
  }
  const json_value *host = get(f, "build.host", KIND(JSON_OBJECT) | KIND(JSON_NULL), 0);
  if (host != NULL && host->kind == JSON_OBJECT && host->as.object.count > 0) {
    get(f, "build.host.triple", KIND(JSON_STRING), 1);
    get(f, "build.host.cpu", KIND(JSON_STRING) | KIND(JSON_NULL), 0);
    strings(f, "build.host.features", 0);
  }
  strings(f, "build.requires", 0);
  if (json_get(kernels, "cuda") != NULL) {
    get(f, "build.cuda.arch", KIND(JSON_STRING) | KIND(JSON_INT), 1);
  }
  const json_value *precision = get(f, "build.precision", KIND(JSON_STRING), 0);
  if (precision != NULL && !json_is_string(precision, "fp32") &&
      !json_is_string(precision, "int8") && !json_is_string(precision, "fp16")) {
    fail(f, "build.precision", "one of fp32, int8, fp16", precision);
  }
}

edgecv_status ec_manifest_check(const json_value *m, const char *root, const char *where,
                                edgecv_error **error) {
  edgecv_status status = check_format(m, root, where, error);
  if (status != EDGECV_OK) return status;
  fields f = {m, where, error, EDGECV_OK};
  const json_value *files = get(&f, "files", KIND(JSON_OBJECT), 1);
  for (size_t i = 0; files != NULL && i < files->as.object.count && f.status == EDGECV_OK; i++) {
    const json_member *file = &files->as.object.members[i];
    char field[160], shown[100];
    snprintf(field, sizeof field, "files: '%s'",
             ec_shown(shown, sizeof shown, file->key, file->key_length, 80));
    json_value key = {JSON_STRING, {0}};
    key.as.string.text = file->key;
    key.as.string.length = file->key_length;
    check_relative(&f, &key, field);
    if (!is_digest(file->value)) {
      snprintf(field, sizeof field, "files.%s", shown);
      fail(&f, field, "a sha256 (64 hex digits)", file->value);
    }
  }
  check_build(&f);
  const json_value *inputs = get(&f, "inputs", KIND(JSON_ARRAY), 1);
  if (inputs != NULL && inputs->as.array.count == 0) fail(&f, "inputs", "one entry per model input", inputs);
  for (size_t i = 0; inputs != NULL && i < inputs->as.array.count; i++) tensor(&f, "inputs", i);
  const json_value *outputs = get(&f, "outputs", KIND(JSON_ARRAY), 1);
  for (size_t i = 0; outputs != NULL && i < outputs->as.array.count; i++) tensor(&f, "outputs", i);
  get(&f, "model.name", KIND(JSON_STRING), 1);
  get(&f, "model.task", KIND(JSON_STRING), 1);
  get(&f, "profile.name", KIND(JSON_STRING), 1);
  get(&f, "profile.runtime", KIND(JSON_STRING), 1);
  get(&f, "profile.gpu", KIND(JSON_OBJECT), 0);
  get(&f, "preprocessing.color", KIND(JSON_STRING), 0);
  get(&f, "preprocessing.scale", NUMBER, 0);
  const char *keys[] = {"preprocessing.mean", "preprocessing.std"};
  for (int k = 0; k < 2; k++) {
    const json_value *values = get(&f, keys[k], KIND(JSON_ARRAY), 1);
    int ok = values != NULL && values->as.array.count == 3;
    for (size_t i = 0; ok && i < 3; i++) ok = (NUMBER & KIND(values->as.array.items[i]->kind)) != 0;
    if (values != NULL && !ok) fail(&f, keys[k], "3 numbers (R, G, B)", values);
  }
  strings(&f, "classes", 0);
  return f.status;
}

const char *ec_manifest_kernel(const json_value *manifest, const char *key) {
  const json_value *v = json_get(json_path(manifest, "build.kernels"), key);
  return v != NULL && v->kind == JSON_STRING ? v->as.string.text : NULL;
}
