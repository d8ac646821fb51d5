/* The CPU kernels: the package's kernels/cpu.so, loaded by apache-tvm-ffi's module
 * loader through its C ABI (libtvm_ffi.so), after TVM's runtime library whose thread
 * pool and workspace functions generated kernels call back into. Never TVM's compiler
 * library: where it is already in the process (a workstation's Python that imported
 * tvm), its own runtime serves, as two copies would register the same functions twice. */
#ifndef EDGECV_TVM_CPU_H
#define EDGECV_TVM_CPU_H

#include <stddef.h>

#include <tvm/ffi/c_api.h>

#include "error.h"

typedef struct {
  const unsigned char *data; /* a package library's bytes as checked, NULL: none */
  size_t size;
  const char *name;          /* its file name: libtvm_runtime.so, ... */
} ec_library;

/* Make TVM's runtime functions available to kernel libraries loaded after this call:
 * `runtime` and `extra` are the package's copies (extra.data NULL where it has none). */
edgecv_status ec_tvm_runtime_load(ec_library runtime, ec_library extra, const char *package,
                                  edgecv_error **error);

/* The module of kernel library `library` (loaded from a private copy of its bytes);
 * `path` names it in messages. */
edgecv_status ec_kernels_load(ec_library library, const char *path, TVMFFIObjectHandle *module,
                              edgecv_error **error);
/* The function `name` of `module`, or E_KERNELS naming it. */
edgecv_status ec_kernels_function(TVMFFIObjectHandle module, const char *name,
                                  TVMFFIObjectHandle *function, edgecv_error **error);
/* Call `function` on `args`; 0 with TVM's reason on one line in `why` where it fails. */
int ec_kernel_call(TVMFFIObjectHandle function, TVMFFIAny *args, int count, char *why, size_t size);
void ec_object_release(TVMFFIObjectHandle object);

#endif
