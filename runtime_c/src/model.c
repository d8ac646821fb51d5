/* edgecv_load: a package checked, its constants in place, its kernels bound. */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "host.h"
#include "manifest.h"
#include "npz.h"
#include "package.h"
#include "tvm_cpu.h"

const char *edgecv_version(void) { return EDGECV_VERSION; }
int edgecv_format_version(void) { return EC_FORMAT_VERSION; }

static void *aligned(struct edgecv_model *m, size_t nbytes) {
  size_t size = (nbytes + EC_CPU_ALIGNMENT - 1) / EC_CPU_ALIGNMENT * EC_CPU_ALIGNMENT;
  void *memory = aligned_alloc(EC_CPU_ALIGNMENT, size ? size : EC_CPU_ALIGNMENT);
  if (memory != NULL) m->allocations[m->allocation_count++] = memory;
  return memory;
}

static void shape_text(const int64_t *shape, int32_t ndim, char *out, size_t size) {
  size_t at = (size_t)snprintf(out, size, "(");
  for (int32_t i = 0; i < ndim && at < size; i++) {
    at += (size_t)snprintf(out + at, size - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
  }
  if (at < size) snprintf(out + at, size - at, "%s)", ndim == 1 ? "," : "");
}

/* The manifest's tensors (inputs or outputs) are the plan's, in order. */
static edgecv_status check_tensors(struct edgecv_model *m, const char *key, const int64_t *ids,
                                   size_t count, edgecv_error **error) {
  const json_value *declared = json_get(m->manifest, key);
  int same = declared->as.array.count == count;
  for (size_t i = 0; same && i < count; i++) {
    const ec_buffer *b = &m->plan.buffers[ids[i]];
    const json_value *t = declared->as.array.items[i], *shape = json_get(t, "shape");
    same = json_is_string(json_get(t, "dtype"), b->dtype->name) &&
           shape->as.array.count == (size_t)b->ndim;
    for (int32_t d = 0; same && d < b->ndim; d++) same = shape->as.array.items[d]->as.integer == b->shape[d];
  }
  if (same) return EDGECV_OK;
  char planned[300] = "", shown[300];
  size_t at = 0;
  for (size_t i = 0; i < count && at < sizeof planned; i++) {
    const ec_buffer *b = &m->plan.buffers[ids[i]];
    shape_text(b->shape, b->ndim, shown, sizeof shown);
    at += (size_t)snprintf(planned + at, sizeof planned - at, "%s%s %s", i ? ", " : "", b->dtype->name, shown);
  }
  return ec_fail(error, EDGECV_E_PLAN,
                 "%s/plan.json has %s [%s] and its manifest says %s; the package is "
                 "inconsistent: redeploy the model",
                 m->root, key, planned, json_render(declared, shown, sizeof shown, 200));
}

static edgecv_status cpu_only(struct edgecv_model *m, const char *device, edgecv_error **error) {
  const char *runtime = json_path(m->manifest, "profile.runtime")->as.string.text;
  int gpu = strcmp(runtime, "cpu") != 0 || json_path(m->manifest, "build.kernels.opencl") ||
            json_path(m->manifest, "build.kernels.cuda");
  for (size_t i = 0; !gpu && i < m->plan.buffer_count; i++) gpu = m->plan.buffers[i].on_gpu;
  for (size_t i = 0; !gpu && i < m->plan.step_count; i++) {
    gpu = m->plan.steps[i].on_gpu || m->plan.steps[i].is_copy;
  }
  if (gpu) {
    return ec_fail(error, EDGECV_E_DEVICE,
                   "%s runs on %s (profile %s); this C runtime runs `cpu` packages only so far "
                   "(OpenCL and CUDA are to come): load it with edgecv.load in Python",
                   m->root, runtime, json_path(m->manifest, "profile.name")->as.string.text);
  }
  (void)device;
  return EDGECV_OK;
}

static edgecv_status place_constants(struct edgecv_model *m, ec_bytes *params, edgecv_error **error) {
  ec_npz npz;
  char why[300];
  edgecv_status status = EDGECV_OK;
  if (!ec_npz_read(params->data, params->size, &npz, why, sizeof why)) {
    status = ec_fail(error, EDGECV_E_PARAMS, "cannot read %s/params.npz (%s); redeploy the model",
                     m->root, why);
  }
  for (size_t i = 0; status == EDGECV_OK && i < m->plan.buffer_count; i++) {
    const ec_buffer *b = &m->plan.buffers[i];
    if (b->kind != EC_CONST) continue;
    const ec_array *value = ec_npz_find(&npz, b->name);
    char have[200], want[200];
    if (value == NULL) {
      status = ec_fail(error, EDGECV_E_PARAMS,
                       "the plan's constant `%s` is not in the package's params (%s/params.npz); "
                       "redeploy the model",
                       b->name, m->root);
      break;
    }
    int same = value->dtype == b->dtype && value->ndim == b->ndim &&
               !memcmp(value->shape, b->shape, sizeof(int64_t) * (size_t)b->ndim);
    if (!same) {
      shape_text(value->shape, value->ndim, have, sizeof have);
      shape_text(b->shape, b->ndim, want, sizeof want);
      status = ec_fail(error, EDGECV_E_PARAMS,
                       "the package's constant `%s` is %s %s, its plan says %s %s; redeploy the model",
                       b->name, value->dtype->name, have, b->dtype->name, want);
      break;
    }
    void *memory = aligned(m, b->nbytes);
    if (memory == NULL) {
      status = ec_fail(error, EDGECV_E_MEMORY, "out of memory for constant `%s` (%zu bytes)", b->name, b->nbytes);
      break;
    }
    memcpy(memory, value->data, b->nbytes);
    m->tensors[i].data = memory;
  }
  ec_npz_free(&npz);
  return status;
}

/* Slots, inputs and the tensors over them; views last (after the buffer they view). */
static edgecv_status place_tensors(struct edgecv_model *m, edgecv_error **error) {
  void **slots = calloc(m->plan.slot_count + 1, sizeof *slots);
  if (slots == NULL) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
  edgecv_status status = EDGECV_OK;
  for (size_t s = 0; s < m->plan.slot_count && status == EDGECV_OK; s++) {
    slots[s] = aligned(m, (size_t)m->plan.storage_sizes[s]);
    if (slots[s] == NULL) status = ec_fail(error, EDGECV_E_MEMORY, "out of memory for the "
                                           "activations (%lld bytes)", (long long)m->plan.storage_sizes[s]);
  }
  for (size_t i = 0; i < m->plan.buffer_count && status == EDGECV_OK; i++) {
    const ec_buffer *b = &m->plan.buffers[i];
    DLTensor *t = &m->tensors[i];
    t->device = (DLDevice){kDLCPU, 0};
    t->ndim = b->ndim;
    t->dtype = b->dtype->dl;
    t->shape = b->shape;
    if (b->kind == EC_TEMP) t->data = (char *)slots[b->storage] + b->offset;
    if (b->kind == EC_INPUT && (t->data = aligned(m, b->nbytes)) == NULL) {
      status = ec_fail(error, EDGECV_E_MEMORY, "out of memory for input `%s`", b->name);
    }
  }
  for (size_t i = 0; i < m->plan.buffer_count && status == EDGECV_OK; i++) {
    if (m->plan.buffers[i].kind == EC_VIEW) {
      m->tensors[i].data = m->tensors[ec_plan_root(&m->plan, (int64_t)i)].data;
    }
  }
  free(slots);
  return status;
}

static edgecv_status bind_launches(struct edgecv_model *m, edgecv_error **error) {
  m->launches = calloc(m->plan.step_count + 1, sizeof *m->launches);
  if (m->launches == NULL) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
  for (size_t i = 0; i < m->plan.step_count; i++) {
    const ec_step *s = &m->plan.steps[i];
    if (s->elided) continue; /* its inputs were written in place */
    ec_launch *launch = &m->launches[m->launch_count];
    for (size_t k = 0; k < m->launch_count && launch->function == NULL; k++) {
      if (!strcmp(m->plan.steps[m->launches[k].step].kernel, s->kernel)) {
        launch->function = m->launches[k].function;
        TVMFFIObjectIncRef(launch->function);
      }
    }
    if (launch->function == NULL) {
      edgecv_status status = ec_kernels_function(m->module, s->kernel, &launch->function, error);
      if (status != EDGECV_OK) return status;
    }
    launch->step = i;
    m->launch_count++;
    launch->args = calloc(s->arg_count + 1, sizeof *launch->args);
    if (launch->args == NULL) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
    launch->count = (int)s->arg_count;
    for (size_t a = 0; a < s->arg_count; a++) {
      launch->args[a].type_index = kTVMFFIDLTensorPtr;
      launch->args[a].v_ptr = &m->tensors[s->args[a]];
    }
  }
  return EDGECV_OK;
}

static edgecv_status describe(struct edgecv_model *m, edgecv_error **error) {
  m->inputs = calloc(m->plan.input_count + 1, sizeof *m->inputs);
  m->outputs = calloc(m->plan.output_count + 1, sizeof *m->outputs);
  if (m->inputs == NULL || m->outputs == NULL) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
  const json_value *declared[] = {json_get(m->manifest, "inputs"), json_get(m->manifest, "outputs")};
  edgecv_tensor_info *infos[] = {m->inputs, m->outputs};
  const int64_t *ids[] = {m->plan.inputs, m->plan.outputs};
  size_t counts[] = {m->plan.input_count, m->plan.output_count};
  for (int e = 0; e < 2; e++) {
    for (size_t i = 0; i < counts[e]; i++) {
      const ec_buffer *b = &m->plan.buffers[ids[e][i]];
      infos[e][i] = (edgecv_tensor_info){
          json_get(declared[e]->as.array.items[i], "name")->as.string.text, b->dtype->name,
          b->ndim, b->shape, b->nbytes};
    }
  }
  return EDGECV_OK;
}

static edgecv_status load_kernels(struct edgecv_model *m, ec_package *package, edgecv_error **error) {
  edgecv_status status = ec_check_host(json_path(m->manifest, "build.host"), m->root, error);
  if (status != EDGECV_OK) return status;
  if (package->cpu.data == NULL) {
    return ec_fail(error, EDGECV_E_MANIFEST,
                   "%s/manifest.json names no CPU kernels (`build.kernels.cpu`) for a plan that "
                   "runs on the CPU; redeploy the model",
                   m->root);
  }
  ec_library runtime = {package->tvm_runtime.data, package->tvm_runtime.size, "libtvm_runtime.so"};
  ec_library extra = {package->tvm_runtime_extra.data, package->tvm_runtime_extra.size,
                      "libtvm_runtime_extra.so"};
  status = ec_tvm_runtime_load(runtime, extra, m->root, error);
  ec_bytes_drop(&package->tvm_runtime);
  ec_bytes_drop(&package->tvm_runtime_extra);
  if (status != EDGECV_OK) return status;
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", m->root, ec_manifest_kernel(m->manifest, "cpu"));
  ec_library cpu = {package->cpu.data, package->cpu.size, "cpu.so"};
  status = ec_kernels_load(cpu, path, &m->module, error);
  ec_bytes_drop(&package->cpu);
  return status;
}

static edgecv_status setup(struct edgecv_model *m, ec_package *package, const char *device,
                           edgecv_error **error) {
  char why[600];
  if (!ec_plan_read((const char *)package->plan.data, package->plan.size, &m->plan, why, sizeof why)) {
    return ec_fail(error, EDGECV_E_PLAN, "%s/plan.json is malformed: %s; redeploy the model", m->root, why);
  }
  ec_bytes_drop(&package->plan);
  edgecv_status status = check_tensors(m, "inputs", m->plan.inputs, m->plan.input_count, error);
  if (status == EDGECV_OK) status = check_tensors(m, "outputs", m->plan.outputs, m->plan.output_count, error);
  if (status == EDGECV_OK) status = cpu_only(m, device, error);
  if (status != EDGECV_OK) return status;
  size_t most = m->plan.slot_count + 2 * m->plan.buffer_count + 1;
  m->allocations = calloc(most, sizeof *m->allocations);
  m->tensors = calloc(m->plan.buffer_count + 1, sizeof *m->tensors);
  if (m->allocations == NULL || m->tensors == NULL) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
  status = place_tensors(m, error);
  if (status == EDGECV_OK) status = place_constants(m, &package->params, error);
  ec_bytes_drop(&package->params);
  if (status == EDGECV_OK) status = load_kernels(m, package, error);
  if (status == EDGECV_OK) status = bind_launches(m, error);
  if (status == EDGECV_OK) status = describe(m, error);
  return status;
}

edgecv_status edgecv_load_pinned(const char *path, const char *device, const char *pin,
                                 edgecv_model **model, edgecv_error **error) {
  if (error != NULL) *error = NULL;
  if (model == NULL || path == NULL) {
    return ec_fail(error, EDGECV_E_ARGUMENT, "edgecv_load: %s is NULL; pass the package folder "
                   "and where to put the model", path == NULL ? "path" : "model");
  }
  *model = NULL;
  if (device != NULL && strcmp(device, "cpu") != 0) {
    char shown[100];
    return ec_fail(error, EDGECV_E_DEVICE,
                   "device '%s': this C runtime runs packages on `cpu` only so far (OpenCL and "
                   "CUDA are to come): pass \"cpu\" or NULL, or load it with edgecv.load in Python",
                   ec_shown(shown, sizeof shown, device, strlen(device), 60));
  }
  struct edgecv_model *m = calloc(1, sizeof *m);
  if (m == NULL) return ec_fail(error, EDGECV_E_MEMORY, "out of memory");
  pthread_mutex_init(&m->lock, NULL);
  ec_package package;
  edgecv_status status = ec_package_open(path, pin, &package, error);
  if (status == EDGECV_OK) {
    m->root = package.root;
    m->manifest = package.manifest;
    package.root = NULL;
    package.manifest = NULL;
    memcpy(m->sha256, package.sha256, sizeof m->sha256);
    status = setup(m, &package, device, error);
  }
  ec_package_close(&package);
  if (status != EDGECV_OK) {
    ec_model_release(m);
    return status;
  }
  *model = m;
  return EDGECV_OK;
}

edgecv_status edgecv_load(const char *path, const char *device, edgecv_model **model,
                          edgecv_error **error) {
  return edgecv_load_pinned(path, device, NULL, model, error);
}
