/* params.npz: the constants by name, as NumPy's savez writes them (a zip archive of
 * .npy files, stored uncompressed, with ZIP64 sizes). Read from the bytes that were
 * checked; nothing is copied until a constant is asked for. */
#ifndef EDGECV_NPZ_H
#define EDGECV_NPZ_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

typedef struct {
  char *name; /* without ".npy" */
  const ec_dtype *dtype;
  int32_t ndim;
  int64_t shape[32];
  const unsigned char *data; /* into the archive's bytes */
  size_t nbytes;
} ec_array;

typedef struct {
  ec_array *arrays;
  size_t count;
} ec_npz;

/* The arrays of the archive `data`; 0 with the reason in `why` where it is not one
 * this reader takes (another compression, a Fortran-order or big-endian array, an
 * entry reaching past the end). */
int ec_npz_read(const unsigned char *data, size_t size, ec_npz *npz, char *why, size_t why_size);
const ec_array *ec_npz_find(const ec_npz *npz, const char *name);
void ec_npz_free(ec_npz *npz);

#endif
