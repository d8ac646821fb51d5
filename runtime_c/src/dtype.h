/* The element types of a package's tensors: NumPy's names, DLPack's codes. */
#ifndef EDGECV_DTYPE_H
#define EDGECV_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

typedef struct {
  const char *name;      /* NumPy's name, as plans and manifests write it */
  const char *npy_descr; /* its little-endian descr in a .npy header */
  DLDataType dl;
  size_t itemsize;
} ec_dtype;

/* The dtype named `name` (NUL-terminated), NULL for one this runtime does not know. */
const ec_dtype *ec_dtype_named(const char *name);
/* The dtype of a .npy `descr` ("<f4", "|u1", ...), NULL for another. */
const ec_dtype *ec_dtype_of_descr(const char *descr);
/* The names known, for messages: "bool, int8, ..., float64". */
const char *ec_dtype_names(void);

/* bytes of a tensor of `shape`, 0 with *overflow set where it exceeds SIZE_MAX */
size_t ec_nbytes(const int64_t *shape, int32_t ndim, size_t itemsize, int *overflow);

#endif
