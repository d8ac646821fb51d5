/* edgecv_run and what a caller reads of a loaded model; edgecv_free. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "model.h"
#include "tvm_cpu.h"

static edgecv_status check_buffers(const edgecv_tensor_info *infos, size_t count,
                                   const void *const *buffers, const size_t *bytes,
                                   const char *what, edgecv_error **error) {
  if (count > 0 && (buffers == NULL || bytes == NULL)) {
    return ec_fail(error, EDGECV_E_ARGUMENT,
                   "edgecv_run: the %ss or their sizes are NULL; pass %zu buffer(s) and sizes", what,
                   count);
  }
  for (size_t i = 0; i < count; i++) {
    if (buffers[i] == NULL || bytes[i] != infos[i].nbytes) {
      return ec_fail(error, EDGECV_E_ARGUMENT,
                     "edgecv_run: %s %zu (`%s`) is %s%zu bytes, the model's is %zu bytes (%s, %d "
                     "dimensions): pass a buffer of exactly its edgecv_%s_info(model, %zu)->nbytes",
                     what, i, infos[i].name, buffers[i] == NULL ? "NULL, " : "",
                     buffers[i] == NULL ? (size_t)0 : bytes[i], infos[i].nbytes, infos[i].dtype,
                     infos[i].ndim, what, i);
    }
  }
  return EDGECV_OK;
}

edgecv_status edgecv_run(edgecv_model *m, const void *const *inputs, const size_t *input_bytes,
                         void *const *outputs, const size_t *output_bytes, edgecv_error **error) {
  if (error != NULL) *error = NULL;
  if (m == NULL) return ec_fail(error, EDGECV_E_ARGUMENT, "edgecv_run: the model is NULL");
  edgecv_status status = check_buffers(m->inputs, m->plan.input_count, inputs, input_bytes, "input", error);
  if (status == EDGECV_OK) {
    status = check_buffers(m->outputs, m->plan.output_count, (const void *const *)outputs,
                           output_bytes, "output", error);
  }
  if (status != EDGECV_OK) return status;
  pthread_mutex_lock(&m->lock);
  for (size_t i = 0; i < m->plan.input_count; i++) {
    memcpy(m->tensors[m->plan.inputs[i]].data, inputs[i], input_bytes[i]);
  }
  char why[1024];
  for (size_t k = 0; k < m->launch_count && status == EDGECV_OK; k++) {
    ec_launch *launch = &m->launches[k];
    if (!ec_kernel_call(launch->function, launch->args, launch->count, why, sizeof why)) {
      status = ec_fail(error, EDGECV_E_INFERENCE,
                       "inference failed at launch %zu of %zu (kernel `%s` on the cpu): %s; the "
                       "call's outputs are lost: call again (a failure that repeats: load the "
                       "model again, or report it with the package)",
                       k + 1, m->launch_count, m->plan.steps[launch->step].kernel, why);
    }
  }
  for (size_t i = 0; i < m->plan.output_count && status == EDGECV_OK; i++) {
    memcpy(outputs[i], m->tensors[m->plan.outputs[i]].data, output_bytes[i]);
  }
  pthread_mutex_unlock(&m->lock);
  return status;
}

size_t edgecv_num_inputs(const edgecv_model *m) { return m ? m->plan.input_count : 0; }
size_t edgecv_num_outputs(const edgecv_model *m) { return m ? m->plan.output_count : 0; }

const edgecv_tensor_info *edgecv_input_info(const edgecv_model *m, size_t index) {
  return m && index < m->plan.input_count ? &m->inputs[index] : NULL;
}

const edgecv_tensor_info *edgecv_output_info(const edgecv_model *m, size_t index) {
  return m && index < m->plan.output_count ? &m->outputs[index] : NULL;
}

const char *edgecv_model_name(const edgecv_model *m) {
  return m ? json_path(m->manifest, "model.name")->as.string.text : NULL;
}

const char *edgecv_model_task(const edgecv_model *m) {
  return m ? json_path(m->manifest, "model.task")->as.string.text : NULL;
}

const char *edgecv_model_sha256(const edgecv_model *m) { return m ? m->sha256 : NULL; }

size_t edgecv_num_classes(const edgecv_model *m) {
  const json_value *classes = m ? json_get(m->manifest, "classes") : NULL;
  return classes != NULL && classes->kind == JSON_ARRAY ? classes->as.array.count : 0;
}

const char *edgecv_class_name(const edgecv_model *m, size_t index) {
  if (index >= edgecv_num_classes(m)) return NULL;
  return json_get(m->manifest, "classes")->as.array.items[index]->as.string.text;
}

void ec_model_release(struct edgecv_model *m) {
  for (size_t k = 0; m->launches != NULL && k < m->launch_count; k++) {
    ec_object_release(m->launches[k].function);
    free(m->launches[k].args);
  }
  free(m->launches);
  ec_object_release(m->module);
  for (size_t i = 0; i < m->allocation_count; i++) free(m->allocations[i]);
  free(m->allocations);
  free(m->tensors);
  free(m->inputs);
  free(m->outputs);
  ec_plan_free(&m->plan);
  json_free(m->manifest);
  free(m->root);
  pthread_mutex_destroy(&m->lock);
  free(m);
}

void edgecv_free(edgecv_model *m) {
  if (m != NULL) ec_model_release(m);
}
