/* The checks of Plan.check (edgecv/board/plan.py) that relate a plan's parts: slots,
 * views, places in slots, chains of pieces, what each launch reads and writes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

int ec_plan_check(ec_plan *plan, char *why, size_t why_size);

typedef struct {
  char *why;
  size_t why_size;
  int failed;
} checker;

static void require(checker *c, int ok, const char *field, const char *expected,
                    const char *found) {
  if (ok || c->failed) return;
  c->failed = 1;
  snprintf(c->why, c->why_size, "%s should be %s, found %.80s", field, expected, found);
}

static const char *shown(const json_value *v, char *buffer, size_t size) {
  return json_render(v, buffer, size, 80);
}

static int64_t owner(const ec_plan *plan, int64_t id) {
  int64_t b = ec_plan_root(plan, id);
  while (plan->buffers[b].piece_of >= 0) b = ec_plan_root(plan, plan->buffers[b].piece_of);
  return b;
}

static int *slot_on_gpu(checker *c, const ec_plan *plan) {
  const json_value *devices = json_get(plan->json, "storage_devices");
  int *gpu = calloc(plan->slot_count + 1, sizeof *gpu);
  if (gpu == NULL) {
    require(c, 0, "storage_devices", "(out of memory)", "");
    return NULL;
  }
  if (devices == NULL) return gpu; /* every slot on the CPU */
  int ok = devices->kind == JSON_ARRAY && devices->as.array.count == plan->slot_count;
  for (size_t i = 0; ok && i < plan->slot_count; i++) {
    const json_value *d = devices->as.array.items[i];
    ok = json_is_string(d, "cpu") || json_is_string(d, "gpu");
    gpu[i] = json_is_string(d, "gpu");
  }
  char text[200];
  require(c, ok, "storage_devices", "one of ('cpu', 'gpu') per storage slot",
          shown(devices, text, sizeof text));
  return gpu;
}

static void check_buffer(checker *c, const ec_plan *plan, const int *gpu, size_t i) {
  const ec_buffer *b = &plan->buffers[i];
  const json_value *raw = plan->json ? json_get(plan->json, "buffers")->as.array.items[i] : NULL;
  char at[64], text[200], expected[200];
  if (b->kind == EC_VIEW) {
    snprintf(at, sizeof at, "buffer %zu: view_of", i);
    snprintf(expected, sizeof expected, "a buffer before it (< %zu)", i);
    require(c, b->view_of >= 0 && (size_t)b->view_of < i, at, expected,
            shown(json_get(raw, "view_of"), text, sizeof text));
    if (c->failed) return;
    const ec_buffer *root = &plan->buffers[ec_plan_root(plan, (int64_t)i)];
    snprintf(at, sizeof at, "buffer %zu: shape", i);
    snprintf(expected, sizeof expected, "at most the %zu bytes of the buffer it views", root->nbytes);
    require(c, b->nbytes <= root->nbytes, at, expected, shown(json_get(raw, "shape"), text, sizeof text));
  }
  if (b->kind == EC_TEMP) {
    snprintf(at, sizeof at, "buffer %zu: storage", i);
    require(c, b->storage >= 0 && (size_t)b->storage < plan->slot_count, at, "a slot",
            shown(json_get(raw, "storage"), text, sizeof text));
    snprintf(at, sizeof at, "buffer %zu: offset", i);
    require(c, b->offset >= 0, at, "bytes >= 0", shown(json_get(raw, "offset"), text, sizeof text));
    snprintf(expected, sizeof expected,
             "a multiple of %d (TVM's CPU kernels take aligned tensors)", EC_CPU_ALIGNMENT);
    require(c, b->on_gpu || b->offset % EC_CPU_ALIGNMENT == 0, at, expected,
            shown(json_get(raw, "offset"), text, sizeof text));
    if (c->failed) return;
    int64_t slot = plan->storage_sizes[b->storage];
    int fits = (uint64_t)b->offset <= (uint64_t)slot && b->nbytes <= (uint64_t)(slot - b->offset);
    snprintf(expected, sizeof expected,
             "a place inside storage slot %lld (%lld bytes on the %s)", (long long)b->storage,
             (long long)slot, gpu[b->storage] ? "gpu" : "cpu");
    snprintf(text, sizeof text, "%lld + %zu bytes on the %s", (long long)b->offset, b->nbytes,
             b->on_gpu ? "gpu" : "cpu");
    require(c, fits && gpu[b->storage] == b->on_gpu, at, expected, text);
  }
  const json_value *piece = json_get(raw, "piece_of");
  snprintf(at, sizeof at, "buffer %zu: piece_of", i);
  require(c, b->piece_of == -1 || (b->piece_of >= 0 && (size_t)b->piece_of < plan->buffer_count),
          at, "a buffer", shown(piece, text, sizeof text));
}

static void check_pieces_end(checker *c, const ec_plan *plan) {
  char *seen = calloc(plan->buffer_count + 1, 1);
  if (seen == NULL) {
    require(c, 0, "buffers", "(out of memory)", "");
    return;
  }
  for (size_t i = 0; i < plan->buffer_count && !c->failed; i++) {
    memset(seen, 0, plan->buffer_count);
    seen[i] = 1;
    int64_t piece = (int64_t)i;
    while (!c->failed && plan->buffers[piece].piece_of >= 0) {
      piece = ec_plan_root(plan, plan->buffers[piece].piece_of);
      char at[64], text[32];
      snprintf(at, sizeof at, "buffer %zu: piece_of", i);
      snprintf(text, sizeof text, "%lld", (long long)plan->buffers[i].piece_of);
      require(c, !seen[piece], at, "no loop", text);
      seen[piece] = 1;
    }
  }
  free(seen);
}

static int positions(const json_value *v, int64_t below) {
  if (v == NULL) return 1; /* the default: none */
  if (v->kind != JSON_ARRAY) return 0;
  for (size_t i = 0; i < v->as.array.count; i++) {
    const json_value *p = v->as.array.items[i];
    if (p->kind != JSON_INT || p->as.integer < 0 || (below >= 0 && p->as.integer >= below)) return 0;
  }
  return 1;
}

static void check_step(checker *c, ec_plan *plan, size_t i, int64_t *workspace_owner) {
  ec_step *s = &plan->steps[i];
  const json_value *raw = json_get(plan->json, "steps")->as.array.items[i];
  char at[64], text[200], expected[200];
  size_t inputs = s->arg_count - (size_t)s->num_outputs;
  for (size_t a = inputs; a < s->arg_count && !c->failed; a++) {
    int64_t written = owner(plan, s->args[a]);
    const ec_buffer *w = &plan->buffers[written];
    if (w->kind == EC_CONST) {
      snprintf(at, sizeof at, "step %zu: output buffer %lld", i, (long long)s->args[a]);
      snprintf(text, sizeof text, "%s `%s`", written == s->args[a] ? "constant" : "a view of constant",
               w->name);
      require(c, 0, at, "memory of the inference, not a constant (shared by every stream)", text);
    }
  }
  if (s->is_copy && !c->failed) {
    snprintf(at, sizeof at, "step %zu: args", i);
    shown(json_get(raw, "args"), text, sizeof text);
    require(c, s->arg_count == 2, at, "[source, destination]", text);
    if (c->failed) return;
    const ec_buffer *from = &plan->buffers[s->args[0]], *to = &plan->buffers[s->args[1]];
    int converts = (!strcmp(from->dtype->name, "float16") && !strcmp(to->dtype->name, "float32")) ||
                   (!strcmp(from->dtype->name, "float32") && !strcmp(to->dtype->name, "float16"));
    int same_shape = from->ndim == to->ndim &&
                     !memcmp(from->shape, to->shape, sizeof(int64_t) * (size_t)from->ndim);
    require(c, from->nbytes == to->nbytes || (converts && same_shape), at,
            "two buffers of one size (or shape, float16 <-> float32)", text);
  }
  const json_value *v = json_get(raw, "elementwise_inputs");
  snprintf(at, sizeof at, "step %zu: elementwise_inputs", i);
  require(c, positions(v, (int64_t)inputs), at, "input positions", shown(v, text, sizeof text));
  v = json_get(raw, "pieces");
  snprintf(at, sizeof at, "step %zu: pieces", i);
  require(c, positions(v, -1), at, "byte offsets", shown(v, text, sizeof text));
  v = json_get(raw, "workspaces");
  snprintf(at, sizeof at, "step %zu: workspaces", i);
  int ok = positions(v, (int64_t)plan->buffer_count);
  size_t count = v != NULL && v->kind == JSON_ARRAY ? v->as.array.count : 0;
  require(c, ok && (!s->is_copy || count == 0), at, "buffer ids (of a kernel launch)",
          shown(v, text, sizeof text));
  for (size_t k = 0; k < count && !c->failed; k++) {
    int64_t w = v->as.array.items[k]->as.integer;
    const ec_buffer *b = &plan->buffers[w];
    int is_arg = 0;
    for (size_t a = 0; a < s->arg_count; a++) is_arg |= s->args[a] == w;
    snprintf(at, sizeof at, "step %zu: workspace %lld", i, (long long)w);
    snprintf(expected, sizeof expected, "a temp buffer on the %s, none of the launch's arguments",
             s->on_gpu ? "gpu" : "cpu");
    snprintf(text, sizeof text, "a %s buffer on the %s",
             (const char *[]){"input", "const", "temp", "view"}[b->kind], b->on_gpu ? "gpu" : "cpu");
    require(c, b->kind == EC_TEMP && b->on_gpu == s->on_gpu && !is_arg, at, expected, text);
    if (workspace_owner[w] < 0) workspace_owner[w] = (int64_t)i;
    snprintf(text, sizeof text, "a workspace of step %lld too", (long long)workspace_owner[w]);
    require(c, workspace_owner[w] == (int64_t)i, at, "a buffer of this launch alone", text);
  }
  s->workspace_count = count;
}

int ec_plan_check(ec_plan *plan, char *why, size_t why_size) {
  checker c = {why, why_size, 0};
  int *gpu = slot_on_gpu(&c, plan);
  for (size_t i = 0; i < plan->buffer_count && !c.failed; i++) check_buffer(&c, plan, gpu, i);
  free(gpu);
  if (!c.failed) check_pieces_end(&c, plan);
  int64_t *workspace_owner = malloc((plan->buffer_count + 1) * sizeof *workspace_owner);
  for (size_t i = 0; workspace_owner != NULL && i < plan->buffer_count; i++) workspace_owner[i] = -1;
  require(&c, workspace_owner != NULL, "steps", "(out of memory)", "");
  for (size_t i = 0; i < plan->step_count && !c.failed; i++) check_step(&c, plan, i, workspace_owner);
  free(workspace_owner);
  for (size_t i = 0; i < plan->input_count && !c.failed; i++) {
    const ec_buffer *b = &plan->buffers[plan->inputs[i]];
    char at[64];
    snprintf(at, sizeof at, "inputs: buffer %lld", (long long)plan->inputs[i]);
    require(&c, b->kind == EC_INPUT, at, "an input buffer",
            (const char *[]){"'input'", "'const'", "'temp'", "'view'"}[b->kind]);
  }
  return !c.failed;
}
