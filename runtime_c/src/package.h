/* A package folder opened and checked before anything of it runs, as the Python
 * loader's open_package (edgecv/board/package.py): the manifest against the pin when
 * one is given, then field by field, then every file it lists against its sha256; the
 * files the loader reads must be listed, and their bytes are kept as they were checked,
 * so what runs is what was checked, whatever the files hold by then. */
#ifndef EDGECV_PACKAGE_H
#define EDGECV_PACKAGE_H

#include "error.h"
#include "json.h"
#include "tvm_cpu.h"

typedef struct {
  unsigned char *data; /* as checked, malloc'd; NULL where the package has none */
  size_t size;
} ec_bytes;

typedef struct {
  char *root;
  json_value *manifest;
  char sha256[65]; /* of manifest.json: the package's pin */
  ec_bytes plan, params, cpu, tvm_runtime, tvm_runtime_extra;
} ec_package;

edgecv_status ec_package_open(const char *path, const char *pin, ec_package *package,
                              edgecv_error **error);
void ec_package_close(ec_package *package);
/* Drop a file's bytes once used (the params are not held twice while they load). */
void ec_bytes_drop(ec_bytes *bytes);

#endif
