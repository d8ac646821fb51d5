/* A package archive (`edgecv deploy`'s .tar.gz, `edgecv.board.package.archive`) read in
 * memory: gunzipped with zlib, its tar members checked as the Python loader checks them
 * before extracting (every member a file or folder inside the package's folder: no
 * absolute path, no "..", no link, no device), and nothing written to disk: a board's
 * read-only storage can hold it. */
#ifndef EDGECV_ARCHIVE_H
#define EDGECV_ARCHIVE_H

#include <stddef.h>

#include "error.h"

typedef struct {
  char *name; /* relative to the package folder: "manifest.json", "kernels/cpu.so" */
  const unsigned char *data;
  size_t size;
} ec_member;

typedef struct {
  unsigned char *tar; /* the gunzipped bytes, members point into it */
  size_t tar_size;
  ec_member *members; /* the files (folders are checked, not kept) */
  size_t count;
} ec_archive;

/* 1 when `path` names a package archive (a name ending in .tar.gz or .tgz). */
int ec_is_archive_name(const char *path);
/* Read and check the archive `path`: EDGECV_E_ARCHIVE naming what is wrong. */
edgecv_status ec_archive_read(const char *path, ec_archive *archive, edgecv_error **error);
/* The file `relative` of the package, NULL where the archive has none. */
const ec_member *ec_archive_member(const ec_archive *archive, const char *relative);
void ec_archive_free(ec_archive *archive);

#endif
