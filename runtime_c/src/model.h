/* A loaded model: the plan, its memory and its launches bound once, at load time, so
 * that a run allocates nothing: it copies the inputs in, calls kernels already bound
 * to their argument tensors, copies the outputs out (as the Python executor). */
#ifndef EDGECV_MODEL_H
#define EDGECV_MODEL_H

#include <pthread.h>

#include <tvm/ffi/c_api.h>

#include "edgecv.h"
#include "json.h"
#include "plan.h"

typedef struct {
  TVMFFIObjectHandle function;
  TVMFFIAny *args; /* DLTensor pointers, in the step's order (outputs last) */
  int count;
  size_t step; /* its index in the plan, for messages */
} ec_launch;

struct edgecv_model {
  pthread_mutex_t lock; /* one inference at a time: they share the plan's memory */
  char *root;
  char sha256[65];
  json_value *manifest;
  ec_plan plan;
  void **allocations; /* storage slots, inputs, constants */
  size_t allocation_count;
  DLTensor *tensors; /* one per buffer of the plan */
  ec_launch *launches;
  size_t launch_count;
  TVMFFIObjectHandle module;
  edgecv_tensor_info *inputs, *outputs;
};

/* Everything of a model being loaded or freed, whatever was made so far. */
void ec_model_release(struct edgecv_model *model);

#endif
