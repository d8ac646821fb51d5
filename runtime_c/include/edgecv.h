/*
 * edgecv.h: the device runtime of edgecv in C (libedgecv_runtime).
 *
 * Loads a package folder (or its .tar.gz) written by `edgecv deploy`, checks it as
 * the Python loader does (the manifest field by field, the sha256 of every file before
 * anything of it runs, the plan's bounds, CPU code this machine cannot execute refused
 * with why) and replays its static plan on caller-owned buffers. Phase 1 runs `cpu` packages: their
 * kernels/cpu.so through apache-tvm-ffi's C ABI (libtvm_ffi.so).
 *
 * Every call returns a status; on failure, where `error` is not NULL, *error receives
 * an error (its code and one line naming what was found, what was expected and what
 * to do) that the caller frees with edgecv_error_free. Nothing aborts the process.
 *
 * A model may be shared by threads: edgecv_run calls on one model run one at a time
 * (a lock per model), calls on different models run at once.
 */
#ifndef EDGECV_H
#define EDGECV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define EDGECV_API __attribute__((visibility("default")))
#else
#define EDGECV_API
#endif

typedef enum {
  EDGECV_OK = 0,
  EDGECV_E_ARGUMENT = 1,  /* a bad call: NULL where a value is needed, a wrong size */
  EDGECV_E_NOT_FOUND = 2, /* the package, or a file it lists, is missing */
  EDGECV_E_IO = 3,        /* a file could not be read */
  EDGECV_E_MANIFEST = 4,  /* manifest.json is corrupt, of another format or version */
  EDGECV_E_CHECKSUM = 5,  /* a file's sha256 is not the one its manifest lists */
  EDGECV_E_PIN = 6,       /* the manifest is not the one the pin names */
  EDGECV_E_PLAN = 7,      /* plan.json is malformed or out of bounds */
  EDGECV_E_PARAMS = 8,    /* params.npz is unreadable or disagrees with the plan */
  EDGECV_E_HOST = 9,      /* the CPU code is for another ISA or needs missing features */
  EDGECV_E_DEVICE = 10,   /* a device this library cannot run the package on */
  EDGECV_E_KERNELS = 11,  /* the kernel library or TVM's runtime cannot be loaded */
  EDGECV_E_INFERENCE = 12, /* a kernel failed while running */
  EDGECV_E_MEMORY = 13,   /* out of memory */
  EDGECV_E_ARCHIVE = 14   /* a .tar.gz package that is unreadable or not a safe archive */
} edgecv_status;

typedef struct edgecv_model edgecv_model;
typedef struct edgecv_error edgecv_error;

/* An input or output of a model; valid while the model is. */
typedef struct {
  const char *name;
  const char *dtype; /* NumPy's name: "float32", "int64", "uint8", "bool", ... */
  int32_t ndim;
  const int64_t *shape;
  size_t nbytes; /* the size of its buffer: product of shape x item size */
} edgecv_tensor_info;

/* The edgecv version whose packages this library reads, and the package format. */
EDGECV_API const char *edgecv_version(void);
EDGECV_API int edgecv_format_version(void);

/* Load the package folder, or its .tar.gz (read in memory, nothing extracted), at
 * `path` on `device` ("cpu", or NULL for the package's own). */
EDGECV_API edgecv_status edgecv_load(const char *path, const char *device,
                                     edgecv_model **model, edgecv_error **error);
/* The same, refused unless the package's manifest has the sha256 `pin` (64 hex
 * digits, printed by `edgecv deploy`): a package changed in any file is refused. */
EDGECV_API edgecv_status edgecv_load_pinned(const char *path, const char *device,
                                            const char *pin, edgecv_model **model,
                                            edgecv_error **error);

EDGECV_API size_t edgecv_num_inputs(const edgecv_model *model);
EDGECV_API size_t edgecv_num_outputs(const edgecv_model *model);
/* NULL for an index out of range. */
EDGECV_API const edgecv_tensor_info *edgecv_input_info(const edgecv_model *model, size_t index);
EDGECV_API const edgecv_tensor_info *edgecv_output_info(const edgecv_model *model, size_t index);
EDGECV_API const char *edgecv_model_name(const edgecv_model *model);
EDGECV_API const char *edgecv_model_task(const edgecv_model *model);
/* The sha256 of the package's manifest (its pin), 64 hex digits. */
EDGECV_API const char *edgecv_model_sha256(const edgecv_model *model);
EDGECV_API size_t edgecv_num_classes(const edgecv_model *model);
EDGECV_API const char *edgecv_class_name(const edgecv_model *model, size_t index);

/* One inference. inputs[i] holds input i's bytes (C order, its dtype; input_bytes[i]
 * must be its nbytes); the outputs are written to outputs[i] (output_bytes[i] must be
 * output i's nbytes). Buffers are the caller's and need no alignment. */
EDGECV_API edgecv_status edgecv_run(edgecv_model *model, const void *const *inputs,
                                    const size_t *input_bytes, void *const *outputs,
                                    const size_t *output_bytes, edgecv_error **error);

EDGECV_API void edgecv_free(edgecv_model *model);

EDGECV_API edgecv_status edgecv_error_code(const edgecv_error *error);
EDGECV_API const char *edgecv_error_message(const edgecv_error *error);
EDGECV_API void edgecv_error_free(edgecv_error *error);

#ifdef __cplusplus
}
#endif

#endif /* EDGECV_H */
