/* The element types a package may hold (see dtype.h). */
#include "dtype.h"

#include <string.h>

static const ec_dtype DTYPES[] = {
    {"bool", "|b1", {kDLBool, 8, 1}, 1},       {"int8", "|i1", {kDLInt, 8, 1}, 1},
    {"int16", "<i2", {kDLInt, 16, 1}, 2},      {"int32", "<i4", {kDLInt, 32, 1}, 4},
    {"int64", "<i8", {kDLInt, 64, 1}, 8},      {"uint8", "|u1", {kDLUInt, 8, 1}, 1},
    {"uint16", "<u2", {kDLUInt, 16, 1}, 2},    {"uint32", "<u4", {kDLUInt, 32, 1}, 4},
    {"uint64", "<u8", {kDLUInt, 64, 1}, 8},    {"float16", "<f2", {kDLFloat, 16, 1}, 2},
    {"float32", "<f4", {kDLFloat, 32, 1}, 4},  {"float64", "<f8", {kDLFloat, 64, 1}, 8},
};
#define COUNT (sizeof DTYPES / sizeof DTYPES[0])

const ec_dtype *ec_dtype_named(const char *name) {
  for (size_t i = 0; i < COUNT; i++) {
    if (strcmp(DTYPES[i].name, name) == 0) return &DTYPES[i];
  }
  return NULL;
}

const ec_dtype *ec_dtype_of_descr(const char *descr) {
  for (size_t i = 0; i < COUNT; i++) {
    const char *own = DTYPES[i].npy_descr;
    /* one-byte types may be written with any byte-order mark */
    if (strcmp(own, descr) == 0 ||
        (DTYPES[i].itemsize == 1 && strchr("<>|=", descr[0]) && strcmp(own + 1, descr + 1) == 0)) {
      return &DTYPES[i];
    }
  }
  return NULL;
}

const char *ec_dtype_names(void) {
  return "bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, float32, "
         "float64";
}

size_t ec_nbytes(const int64_t *shape, int32_t ndim, size_t itemsize, int *overflow) {
  size_t total = itemsize;
  *overflow = 0;
  for (int32_t i = 0; i < ndim; i++) {
    if (shape[i] < 0) {
      *overflow = 1;
      return 0;
    }
    if (shape[i] == 0) return 0;
    if ((uint64_t)shape[i] > SIZE_MAX / total) {
      *overflow = 1;
      return 0;
    }
    total *= (size_t)shape[i];
  }
  return total;
}
