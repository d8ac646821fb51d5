/* The static plan (plan.json): buffers, launches and storage slots, read and checked as
 * the Python loader does (edgecv/board/plan.py, Plan.from_json and Plan.check) before
 * anything is allocated or bound: every index points where it must, every tensor fits
 * the memory it is placed in, at an offset TVM's kernels can take, no launch writes a
 * constant. */
#ifndef EDGECV_PLAN_H
#define EDGECV_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "json.h"

typedef enum { EC_INPUT, EC_CONST, EC_TEMP, EC_VIEW } ec_buffer_kind;

typedef struct {
  int32_t ndim;
  int64_t *shape;
  const ec_dtype *dtype;
  ec_buffer_kind kind;
  const char *name;
  int on_gpu;
  int64_t view_of, storage, offset, piece_of; /* -1: none (view_of, storage, piece_of) */
  size_t nbytes;
} ec_buffer;

typedef struct {
  const char *kernel;
  int64_t *args;
  size_t arg_count;
  int64_t num_outputs;
  int on_gpu, is_copy, elided;
  size_t workspace_count;
} ec_step;

typedef struct {
  json_value *json; /* the plan's text, parsed; names above point into it */
  ec_buffer *buffers;
  size_t buffer_count;
  ec_step *steps;
  size_t step_count;
  int64_t *inputs, *outputs;
  size_t input_count, output_count;
  int64_t *storage_sizes;
  size_t slot_count;
} ec_plan;

/* Read and check the plan `text`; 0 with the reason in `why` where it is malformed. */
int ec_plan_read(const char *text, size_t length, ec_plan *plan, char *why, size_t why_size);
void ec_plan_free(ec_plan *plan);

/* The buffer owning the bytes of `id`: views followed. */
int64_t ec_plan_root(const ec_plan *plan, int64_t id);

/* CPU tensors start at multiples of this (TVM's kernels take aligned tensors). */
#define EC_CPU_ALIGNMENT 64

#endif
