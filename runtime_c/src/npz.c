/* Reading NumPy's .npz archives (see npz.h): the zip central directory, each entry's
 * local header, and the .npy header of each array. */
#include "npz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t le(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static int bad(char *why, size_t size, const char *what) {
  snprintf(why, size, "%s", what);
  return 0;
}

/* The ZIP64 extra field's values replace those written as 0xFFFFFFFF, in order. */
static void zip64_sizes(const unsigned char *extra, size_t length, uint64_t *values[], int count) {
  for (size_t at = 0; at + 4 <= length;) {
    unsigned id = (unsigned)le(extra + at, 2), n = (unsigned)le(extra + at + 2, 2);
    if (at + 4 + n > length) return;
    if (id == 1) {
      size_t k = 0;
      for (int i = 0; i < count; i++) {
        if (*values[i] == 0xFFFFFFFFu && k + 8 <= n) {
          *values[i] = le(extra + at + 4 + k, 8);
          k += 8;
        }
      }
      return;
    }
    at += 4 + n;
  }
}

/* The .npy header's dict: 'descr', 'fortran_order' and 'shape'. */
static int read_npy(const unsigned char *p, size_t size, ec_array *array, char *why, size_t why_size) {
  if (size < 10 || memcmp(p, "\x93NUMPY", 6) != 0) return bad(why, why_size, "an entry is not a .npy array");
  size_t header, start;
  if (p[6] == 1) {
    header = (size_t)le(p + 8, 2);
    start = 10;
  } else if (size >= 12 && (p[6] == 2 || p[6] == 3)) {
    header = (size_t)le(p + 8, 4);
    start = 12;
  } else {
    return bad(why, why_size, "an entry is a .npy of a version this reader does not know");
  }
  if (header > size - start) return bad(why, why_size, "a .npy header reaches past its entry");
  char text[4096];
  if (header >= sizeof text) return bad(why, why_size, "a .npy header is too long");
  memcpy(text, p + start, header);
  text[header] = '\0';
  char descr[16] = "";
  const char *d = strstr(text, "'descr':");
  if (d == NULL || sscanf(d, "'descr': '%15[^']'", descr) != 1) return bad(why, why_size, "a .npy header names no descr");
  array->dtype = ec_dtype_of_descr(descr);
  if (array->dtype == NULL) {
    snprintf(why, why_size, "an array has dtype '%s', which this runtime does not read "
             "(little-endian %s)", descr, ec_dtype_names());
    return 0;
  }
  const char *f = strstr(text, "'fortran_order':");
  if (f == NULL || strncmp(f + 16 + strspn(f + 16, " "), "False", 5) != 0) {
    return bad(why, why_size, "an array is in Fortran order (savez of C-order arrays never is)");
  }
  const char *s = strstr(text, "'shape':");
  const char *open = s ? strchr(s, '(') : NULL;
  if (open == NULL) return bad(why, why_size, "a .npy header names no shape");
  array->ndim = 0;
  for (const char *q = open + 1; *q && *q != ')';) {
    char *end;
    long long dim = strtoll(q, &end, 10);
    if (end == q) {
      q++;
      continue;
    }
    if (dim < 0 || array->ndim >= 32) return bad(why, why_size, "a .npy shape is not one this reader takes");
    array->shape[array->ndim++] = dim;
    q = end;
  }
  int overflow;
  array->nbytes = ec_nbytes(array->shape, array->ndim, array->dtype->itemsize, &overflow);
  if (overflow || array->nbytes > size - start - header) {
    return bad(why, why_size, "an array's data reaches past its entry (a truncated file)");
  }
  array->data = p + start + header;
  return 1;
}

int ec_npz_read(const unsigned char *data, size_t size, ec_npz *npz, char *why, size_t why_size) {
  memset(npz, 0, sizeof *npz);
  /* the end of central directory record: 22 bytes and a comment of up to 64 KiB */
  const unsigned char *eocd = NULL;
  if (size >= 22) {
    size_t lowest = size - 22 > 65535 ? size - 22 - 65535 : 0;
    for (size_t at = size - 22 + 1; at-- > lowest;) {
      if (le(data + at, 4) == 0x06054b50) {
        eocd = data + at;
        break;
      }
    }
  }
  if (eocd == NULL) return bad(why, why_size, "not a zip archive (no end of central directory)");
  uint64_t count = le(eocd + 10, 2), directory = le(eocd + 16, 4);
  size_t at = (size_t)(eocd - data);
  if ((count == 0xFFFF || directory == 0xFFFFFFFFu) && at >= 20 && le(data + at - 20, 4) == 0x07064b50) {
    uint64_t record = le(data + at - 20 + 8, 8);
    if (record + 56 > size || le(data + record, 4) != 0x06064b50) return bad(why, why_size, "a damaged ZIP64 directory");
    count = le(data + record + 32, 8);
    directory = le(data + record + 48, 8);
  }
  if (directory > size || count > size / 46) return bad(why, why_size, "a central directory outside the file");
  npz->arrays = calloc(count + 1, sizeof *npz->arrays);
  if (npz->arrays == NULL) return bad(why, why_size, "out of memory");
  size_t p = (size_t)directory;
  for (uint64_t i = 0; i < count; i++) {
    if (p + 46 > size || le(data + p, 4) != 0x02014b50) return bad(why, why_size, "a damaged central directory");
    unsigned method = (unsigned)le(data + p + 10, 2);
    uint64_t compressed = le(data + p + 20, 4), plain = le(data + p + 24, 4);
    size_t name_length = (size_t)le(data + p + 28, 2), extra_length = (size_t)le(data + p + 30, 2);
    size_t comment_length = (size_t)le(data + p + 32, 2);
    uint64_t local = le(data + p + 42, 4);
    if (p + 46 + name_length + extra_length + comment_length > size) return bad(why, why_size, "a damaged central directory");
    uint64_t *values[] = {&plain, &compressed, &local};
    zip64_sizes(data + p + 46 + name_length, extra_length, values, 3);
    ec_array *array = &npz->arrays[npz->count];
    array->name = malloc(name_length + 1);
    if (array->name == NULL) return bad(why, why_size, "out of memory");
    memcpy(array->name, data + p + 46, name_length);
    array->name[name_length] = '\0';
    npz->count++;
    if (name_length > 4 && strcmp(array->name + name_length - 4, ".npy") == 0) array->name[name_length - 4] = '\0';
    if (method != 0 || compressed != plain) {
      return bad(why, why_size, "an entry is compressed (np.savez_compressed); edgecv writes params "
                 "with np.savez, uncompressed");
    }
    if (local + 30 > size || le(data + local, 4) != 0x04034b50) return bad(why, why_size, "a damaged local header");
    size_t start = (size_t)local + 30 + (size_t)le(data + local + 26, 2) + (size_t)le(data + local + 28, 2);
    if (start > size || plain > size - start) return bad(why, why_size, "an entry reaches past the end of the file");
    if (!read_npy(data + start, (size_t)plain, array, why, why_size)) return 0;
    p += 46 + name_length + extra_length + comment_length;
  }
  return 1;
}

const ec_array *ec_npz_find(const ec_npz *npz, const char *name) {
  for (size_t i = 0; i < npz->count; i++) {
    if (strcmp(npz->arrays[i].name, name) == 0) return &npz->arrays[i];
  }
  return NULL;
}

void ec_npz_free(ec_npz *npz) {
  for (size_t i = 0; i < npz->count; i++) free(npz->arrays[i].name);
  free(npz->arrays);
  memset(npz, 0, sizeof *npz);
}
