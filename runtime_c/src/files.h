/* Files of a package: read whole, named inside it, and private copies of libraries. */
#ifndef EDGECV_FILES_H
#define EDGECV_FILES_H

#include <stddef.h>

#include "error.h"

/* The bytes of `path` (malloc'd, NUL-terminated for text) in *data, or an error
 * naming `what` it is: EDGECV_E_NOT_FOUND where it does not exist, else E_IO. */
edgecv_status ec_read_file(const char *path, const char *what, unsigned char **data,
                           size_t *size, edgecv_error **error);

/* 1 when `relative` (of `length` bytes) names a file inside the package: relative, no
 * "..", no drive letter, no control character (as the Python loader's check). */
int ec_inside_package(const char *relative, size_t length);

/* Where to load the library `data` (a package file named `name`, its bytes as they
 * were checked) from: a copy of exactly those bytes in this process's own folder,
 * made by mkdtemp (mode 0700, a name no one can guess), never the package's own path,
 * whose file may have changed since it was checked. *path is malloc'd. */
edgecv_status ec_private_copy(const char *name, const void *data, size_t size, char **path,
                              edgecv_error **error);
/* Remove a private copy once loaded (the loader keeps its mapping). */
void ec_private_remove(const char *path);

#endif
