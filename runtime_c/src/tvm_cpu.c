/* Loading and calling CPU kernels through apache-tvm-ffi's C ABI (see tvm_cpu.h). */
#define _GNU_SOURCE
#include "tvm_cpu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "files.h"

/* Loading is one at a time in the process: TVM's runtime is loaded once, and a private
 * copy is removed only once the loader has mapped it. */
static pthread_mutex_t loading = PTHREAD_MUTEX_INITIALIZER;

/* TVM's reason for the last failure, on one line: its kind and the message's first
 * line (its argument checks say what was wrong there and the value expected last). */
static void raised(char *why, size_t size) {
  TVMFFIObjectHandle error = NULL;
  TVMFFIErrorMoveFromRaised(&error);
  if (error == NULL) {
    snprintf(why, size, "an error TVM did not describe");
    return;
  }
  const TVMFFIErrorCell *cell = (const TVMFFIErrorCell *)((const char *)error + sizeof(TVMFFIObject));
  const char *text = cell->message.data;
  size_t length = cell->message.size, first = 0;
  while (first < length && text[first] != '\n') first++;
  const char *last = text + length;
  size_t last_length = 0;
  static const char calling[] = " when calling:";
  if (first >= sizeof calling - 1 && !memcmp(text + first - (sizeof calling - 1), calling, sizeof calling - 1)) {
    first -= sizeof calling - 1;
    while (last > text && (last[-1] == '\n' || last[-1] == ' ')) last--;
    const char *start = last;
    while (start > text && start[-1] != '\n') start--;
    last_length = (size_t)(last - start);
    last = start;
    while (last_length && (*last == ' ')) last++, last_length--;
    if (last_length && *last == '`') last_length = 0;
  }
  snprintf(why, size, "%.*s: %.*s%s%.*s", (int)cell->kind.size, cell->kind.data, (int)first, text,
           last_length ? ", " : "", (int)(last_length > 200 ? 200 : last_length), last);
  TVMFFIObjectDecRef(error);
}

void ec_object_release(TVMFFIObjectHandle object) {
  if (object != NULL) TVMFFIObjectDecRef(object);
}

static TVMFFIObjectHandle global(const char *name) {
  TVMFFIByteArray bytes = {name, strlen(name)};
  TVMFFIObjectHandle function = NULL;
  if (TVMFFIFunctionGetGlobal(&bytes, &function) != 0) return NULL;
  return function;
}

/* dlopen's handle of a loaded library of that soname, without loading one */
static int loaded(const char *soname) {
  void *handle = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
  if (handle != NULL) dlclose(handle);
  return handle != NULL;
}

static edgecv_status load_global(ec_library library, const char *package, edgecv_error **error) {
  char *path = NULL;
  edgecv_status status = ec_private_copy(library.name, library.data, library.size, &path, error);
  if (status != EDGECV_OK) return status;
  /* its symbols serve the kernel libraries loaded after it; never unloaded */
  void *handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (handle == NULL) {
    status = ec_fail(error, EDGECV_E_KERNELS, "cannot load TVM's runtime library %s/kernels/%s: %s",
                     package, library.name, dlerror());
  }
  ec_private_remove(path);
  free(path);
  return status;
}

edgecv_status ec_tvm_runtime_load(ec_library runtime, ec_library extra, const char *package,
                                  edgecv_error **error) {
  edgecv_status status = EDGECV_OK;
  pthread_mutex_lock(&loading);
  /* TVM's compiler library in the process carries its runtime: that one serves */
  if (!loaded("libtvm.so")) {
    ec_library wanted[] = {runtime, extra};
    for (int i = 0; i < 2 && status == EDGECV_OK; i++) {
      if (wanted[i].data != NULL && !loaded(wanted[i].name)) {
        status = load_global(wanted[i], package, error);
      }
    }
  }
  if (status == EDGECV_OK && dlsym(RTLD_DEFAULT, "TVMBackendParallelLaunch") == NULL) {
    status = ec_fail(error, EDGECV_E_KERNELS,
                     "%s: its CPU kernels need TVM's runtime library (libtvm_runtime.so), which "
                     "it does not carry and this process has not loaded: redeploy the model with "
                     "this edgecv (packages carry it beside kernels/cpu.so)",
                     package);
  }
  pthread_mutex_unlock(&loading);
  return status;
}

edgecv_status ec_kernels_load(ec_library library, const char *path, TVMFFIObjectHandle *module,
                              edgecv_error **error) {
  *module = NULL;
  char *copy = NULL, why[1024];
  pthread_mutex_lock(&loading);
  edgecv_status status = ec_private_copy(library.name, library.data, library.size, &copy, error);
  TVMFFIObjectHandle load = status == EDGECV_OK ? global("ffi.ModuleLoadFromFile") : NULL;
  if (status == EDGECV_OK && load == NULL) {
    status = ec_fail(error, EDGECV_E_KERNELS,
                     "libtvm_ffi.so has no `ffi.ModuleLoadFromFile`: this libedgecv_runtime was "
                     "built for another apache-tvm-ffi; rebuild it against the one installed");
  }
  if (status == EDGECV_OK) {
    TVMFFIAny arg = {.type_index = kTVMFFIRawStr, .v_c_str = copy};
    TVMFFIAny result = {.type_index = kTVMFFINone};
    if (TVMFFIFunctionCall(load, &arg, 1, &result) != 0) {
      raised(why, sizeof why);
      status = ec_fail(error, EDGECV_E_KERNELS, "cannot load CPU kernels from %s: %s", path, why);
    } else if (result.type_index != kTVMFFIModule) {
      if (result.type_index >= kTVMFFIStaticObjectBegin) TVMFFIObjectDecRef(result.v_obj);
      status = ec_fail(error, EDGECV_E_KERNELS, "cannot load CPU kernels from %s: TVM's loader "
                       "returned no module", path);
    } else {
      *module = result.v_obj;
    }
  }
  ec_object_release(load);
  ec_private_remove(copy);
  free(copy);
  pthread_mutex_unlock(&loading);
  return status;
}

edgecv_status ec_kernels_function(TVMFFIObjectHandle module, const char *name,
                                  TVMFFIObjectHandle *function, edgecv_error **error) {
  *function = NULL;
  char why[1024];
  TVMFFIObjectHandle get = global("ffi.ModuleGetFunction");
  if (get == NULL) {
    return ec_fail(error, EDGECV_E_KERNELS, "libtvm_ffi.so has no `ffi.ModuleGetFunction`: "
                   "rebuild libedgecv_runtime against the apache-tvm-ffi installed");
  }
  TVMFFIAny args[3] = {{.type_index = kTVMFFIModule, .v_obj = module},
                       {.type_index = kTVMFFIRawStr, .v_c_str = name},
                       {.type_index = kTVMFFIBool, .v_int64 = 0}};
  TVMFFIAny result = {.type_index = kTVMFFINone};
  int failed = TVMFFIFunctionCall(get, args, 3, &result);
  ec_object_release(get);
  if (failed) {
    raised(why, sizeof why);
    return ec_fail(error, EDGECV_E_KERNELS, "cannot look up kernel `%s`: %s", name, why);
  }
  if (result.type_index != kTVMFFIFunction) {
    if (result.type_index >= kTVMFFIStaticObjectBegin) TVMFFIObjectDecRef(result.v_obj);
    return ec_fail(error, EDGECV_E_KERNELS,
                   "kernel `%s` is missing from the CPU kernel library; the package's plan and "
                   "kernels come from different builds: redeploy the model",
                   name);
  }
  *function = result.v_obj;
  return EDGECV_OK;
}

int ec_kernel_call(TVMFFIObjectHandle function, TVMFFIAny *args, int count, char *why, size_t size) {
  TVMFFIAny result = {.type_index = kTVMFFINone};
  if (TVMFFIFunctionCall(function, args, count, &result) != 0) {
    raised(why, size);
    return 0;
  }
  if (result.type_index >= kTVMFFIStaticObjectBegin) TVMFFIObjectDecRef(result.v_obj);
  return 1;
}
