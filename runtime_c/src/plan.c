/* Reading plan.json into typed buffers and steps, refusing what the Python loader's
 * Plan.from_json refuses (a field missing, unknown or of the wrong type). The checks
 * of Plan.check that relate buffers and steps are in plan_check.c. */
#include "plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ec_plan_check(ec_plan *plan, char *why, size_t why_size);

typedef struct {
  char *why;
  size_t why_size;
  int failed;
} reader;

static void malformed(reader *r, const char *format, ...) {
  if (r->failed) return;
  r->failed = 1;
  int n = snprintf(r->why, r->why_size, "malformed plan: ");
  va_list args;
  va_start(args, format);
  vsnprintf(r->why + n, r->why_size - (size_t)n, format, args);
  va_end(args);
}

static const json_value *list(reader *r, const json_value *raw, const char *key) {
  const json_value *v = json_get(raw, key);
  if (r->failed) return NULL;
  if (v == NULL) {
    malformed(r, "field '%s' is missing", key);
  } else if (v->kind != JSON_ARRAY) {
    malformed(r, "field '%s' is a %s, not a list", key, json_kind_name(v));
  } else {
    return v;
  }
  return NULL;
}

/* `object` has only `known` keys and all of the first `required` of them. */
static int fields_known(reader *r, const json_value *object, const char *what,
                        const char *const *known, size_t count, size_t required) {
  if (object->kind != JSON_OBJECT) {
    malformed(r, "a %s is a %s, not an object", what, json_kind_name(object));
    return 0;
  }
  for (size_t i = 0; i < object->as.object.count; i++) {
    const json_member *m = &object->as.object.members[i];
    size_t k = 0;
    while (k < count && (strlen(known[k]) != m->key_length || memcmp(known[k], m->key, m->key_length)))
      k++;
    if (k == count) {
      char shown[100];
      json_value key = {JSON_STRING, {0}};
      key.as.string.text = m->key;
      key.as.string.length = m->key_length;
      malformed(r, "%s got an unexpected field %s", what, json_render(&key, shown, sizeof shown, 60));
      return 0;
    }
  }
  for (size_t k = 0; k < required; k++) {
    if (json_get(object, known[k]) == NULL) {
      malformed(r, "%s is missing its field '%s'", what, known[k]);
      return 0;
    }
  }
  return 1;
}

/* A list of whole numbers into a malloc'd array; 0 where it is none (the caller says). */
static int ints(const json_value *v, int64_t **out, size_t *count) {
  *out = NULL;
  *count = 0;
  if (v == NULL || v->kind != JSON_ARRAY) return 0;
  for (size_t i = 0; i < v->as.array.count; i++) {
    if (v->as.array.items[i]->kind != JSON_INT) return 0;
  }
  *out = calloc(v->as.array.count + 1, sizeof **out);
  if (*out == NULL) return 0;
  for (size_t i = 0; i < v->as.array.count; i++) (*out)[i] = v->as.array.items[i]->as.integer;
  *count = v->as.array.count;
  return 1;
}

static void require(reader *r, int ok, const char *field, const char *expected,
                    const json_value *found) {
  if (ok || r->failed) return;
  char shown[200];
  r->failed = 1;
  snprintf(r->why, r->why_size, "%s should be %s, found %s", field, expected,
           json_render(found, shown, sizeof shown, 80));
}

static const char *const BUFFER_FIELDS[] = {"id",   "shape",   "dtype",  "kind",   "name",
                                            "view_of", "storage", "device", "offset", "piece_of"};
static const char *const STEP_FIELDS[] = {"kernel", "args", "num_outputs", "device", "kind",
                                          "elementwise_inputs", "pieces", "elided", "workspaces"};

static int64_t optional_index(const json_value *v) {
  return v == NULL || v->kind == JSON_NULL ? -1 : v->kind == JSON_INT ? v->as.integer : -2;
}

static void read_buffer(reader *r, ec_plan *plan, size_t i, const json_value *raw) {
  if (!fields_known(r, raw, "buffer", BUFFER_FIELDS, 10, 4)) return;
  char at[64];
  ec_buffer *b = &plan->buffers[i];
  const json_value *v;
  v = json_get(raw, "id");
  snprintf(at, sizeof at, "buffer %zu: id", i);
  require(r, v->kind == JSON_INT && v->as.integer == (int64_t)i, at, "its place (buffers in id order)", v);
  v = json_get(raw, "shape");
  size_t ndim = 0;
  int ok = ints(v, &b->shape, &ndim);
  for (size_t d = 0; ok && d < ndim; d++) ok = b->shape[d] >= 0;
  snprintf(at, sizeof at, "buffer %zu: shape", i);
  require(r, ok && ndim <= 32, at, "sizes (whole numbers >= 0)", v);
  b->ndim = (int32_t)ndim;
  v = json_get(raw, "dtype");
  b->dtype = v->kind == JSON_STRING ? ec_dtype_named(v->as.string.text) : NULL;
  snprintf(at, sizeof at, "buffer %zu: dtype", i);
  require(r, b->dtype != NULL, at, "a NumPy dtype name this runtime knows", v);
  v = json_get(raw, "kind");
  static const char *kinds[] = {"input", "const", "temp", "view"};
  int kind = -1;
  for (int k = 0; k < 4; k++) if (json_is_string(v, kinds[k])) kind = k;
  snprintf(at, sizeof at, "buffer %zu: kind", i);
  require(r, kind >= 0, at, "one of ('input', 'const', 'temp', 'view')", v);
  b->kind = (ec_buffer_kind)kind;
  v = json_get(raw, "device");
  snprintf(at, sizeof at, "buffer %zu: device", i);
  require(r, v == NULL || json_is_string(v, "cpu") || json_is_string(v, "gpu"), at,
          "one of ('cpu', 'gpu')", v);
  b->on_gpu = json_is_string(v, "gpu");
  v = json_get(raw, "name");
  snprintf(at, sizeof at, "buffer %zu: name", i);
  require(r, v == NULL || v->kind == JSON_STRING, at, "a string", v);
  b->name = v != NULL && v->kind == JSON_STRING ? v->as.string.text : "";
  b->view_of = optional_index(json_get(raw, "view_of"));
  b->storage = optional_index(json_get(raw, "storage"));
  b->piece_of = optional_index(json_get(raw, "piece_of"));
  v = json_get(raw, "offset");
  b->offset = v == NULL ? 0 : v->kind == JSON_INT ? v->as.integer : -1;
  if (!r->failed) {
    int overflow;
    b->nbytes = ec_nbytes(b->shape, b->ndim, b->dtype->itemsize, &overflow);
    snprintf(at, sizeof at, "buffer %zu: shape", i);
    require(r, !overflow, at, "a size this machine can address", json_get(raw, "shape"));
  }
  /* kept for the checks that read them in the raw (plan_check.c) */
  (void)plan;
}

static void read_step(reader *r, ec_plan *plan, size_t i, const json_value *raw) {
  if (!fields_known(r, raw, "step", STEP_FIELDS, 9, 2)) return;
  char at[64];
  ec_step *s = &plan->steps[i];
  const json_value *v = json_get(raw, "kernel");
  snprintf(at, sizeof at, "step %zu: kernel", i);
  require(r, v->kind == JSON_STRING, at, "a name", v);
  s->kernel = v->kind == JSON_STRING ? v->as.string.text : "";
  v = json_get(raw, "args");
  int ok = ints(v, &s->args, &s->arg_count);
  for (size_t a = 0; ok && a < s->arg_count; a++) {
    ok = s->args[a] >= 0 && (size_t)s->args[a] < plan->buffer_count;
  }
  snprintf(at, sizeof at, "step %zu: args", i);
  require(r, ok, at, "buffer ids", v);
  v = json_get(raw, "num_outputs");
  s->num_outputs = v == NULL ? 1 : v->kind == JSON_INT ? v->as.integer : 0;
  snprintf(at, sizeof at, "step %zu: num_outputs", i);
  require(r, s->num_outputs >= 1 && (size_t)s->num_outputs <= s->arg_count, at,
          "1 to the number of args", v);
  v = json_get(raw, "kind");
  snprintf(at, sizeof at, "step %zu: kind", i);
  require(r, v == NULL || json_is_string(v, "kernel") || json_is_string(v, "copy"), at,
          "one of ('kernel', 'copy')", v);
  s->is_copy = json_is_string(v, "copy");
  v = json_get(raw, "device");
  snprintf(at, sizeof at, "step %zu: device", i);
  require(r, v == NULL || json_is_string(v, "cpu") || json_is_string(v, "gpu"), at,
          "one of ('cpu', 'gpu')", v);
  s->on_gpu = json_is_string(v, "gpu");
  v = json_get(raw, "elided");
  snprintf(at, sizeof at, "step %zu: elided", i);
  require(r, v == NULL || v->kind == JSON_BOOL, at, "true or false", v);
  s->elided = v != NULL && v->kind == JSON_BOOL && v->as.boolean;
}

int ec_plan_read(const char *text, size_t length, ec_plan *plan, char *why, size_t why_size) {
  memset(plan, 0, sizeof *plan);
  reader r = {why, why_size, 0};
  plan->json = json_parse(text, length, why, why_size);
  if (plan->json == NULL) return 0;
  const json_value *raw = plan->json;
  if (raw->kind != JSON_OBJECT) {
    snprintf(why, why_size, "malformed plan: a JSON %s, not an object", json_kind_name(raw));
    return 0;
  }
  const json_value *buffers = list(&r, raw, "buffers"), *steps = list(&r, raw, "steps");
  const json_value *inputs = list(&r, raw, "inputs"), *outputs = list(&r, raw, "outputs");
  const json_value *slots = list(&r, raw, "storage_sizes");
  if (r.failed) return 0;
  plan->buffer_count = buffers->as.array.count;
  plan->step_count = steps->as.array.count;
  plan->buffers = calloc(plan->buffer_count + 1, sizeof *plan->buffers);
  plan->steps = calloc(plan->step_count + 1, sizeof *plan->steps);
  if (plan->buffers == NULL || plan->steps == NULL) {
    snprintf(why, why_size, "out of memory reading the plan");
    return 0;
  }
  for (size_t i = 0; i < plan->buffer_count && !r.failed; i++) {
    read_buffer(&r, plan, i, buffers->as.array.items[i]);
  }
  for (size_t i = 0; i < plan->step_count && !r.failed; i++) {
    read_step(&r, plan, i, steps->as.array.items[i]);
  }
  if (r.failed) return 0;
  int ok = ints(slots, &plan->storage_sizes, &plan->slot_count);
  for (size_t i = 0; ok && i < plan->slot_count; i++) ok = plan->storage_sizes[i] >= 0;
  require(&r, ok, "storage_sizes", "sizes in bytes", slots);
  const char *names[] = {"inputs", "outputs"};
  const json_value *ends[] = {inputs, outputs};
  int64_t **ids[] = {&plan->inputs, &plan->outputs};
  size_t *counts[] = {&plan->input_count, &plan->output_count};
  for (int e = 0; e < 2 && !r.failed; e++) {
    ok = ints(ends[e], ids[e], counts[e]);
    for (size_t i = 0; ok && i < *counts[e]; i++) {
      ok = (*ids[e])[i] >= 0 && (size_t)(*ids[e])[i] < plan->buffer_count;
    }
    require(&r, ok, names[e], "buffer ids", ends[e]);
  }
  if (r.failed) return 0;
  return ec_plan_check(plan, why, why_size);
}

void ec_plan_free(ec_plan *plan) {
  for (size_t i = 0; plan->buffers != NULL && i < plan->buffer_count; i++) free(plan->buffers[i].shape);
  for (size_t i = 0; plan->steps != NULL && i < plan->step_count; i++) free(plan->steps[i].args);
  free(plan->buffers);
  free(plan->steps);
  free(plan->inputs);
  free(plan->outputs);
  free(plan->storage_sizes);
  json_free(plan->json);
  memset(plan, 0, sizeof *plan);
}

int64_t ec_plan_root(const ec_plan *plan, int64_t id) {
  while (plan->buffers[id].kind == EC_VIEW) id = plan->buffers[id].view_of;
  return id;
}
