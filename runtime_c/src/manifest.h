/* The package's manifest.json: its checks, field by field, as the Python loader's
 * (edgecv/board/manifest.py, check_manifest), and the fields the loader reads. */
#ifndef EDGECV_MANIFEST_H
#define EDGECV_MANIFEST_H

#include "error.h"
#include "json.h"

#define EC_FORMAT "edgecv-package"
#define EC_FORMAT_VERSION 2
#define EC_MANIFEST "manifest.json"

/* Refuse, with one line naming the field, a manifest the loader could not use: the
 * format, format version and edgecv version first, then every field loading and
 * running read. `where` is the manifest's path, for messages. */
edgecv_status ec_manifest_check(const json_value *manifest, const char *root, const char *where,
                                edgecv_error **error);

/* build.kernels[key] (a checked manifest's), NULL where it names none. */
const char *ec_manifest_kernel(const json_value *manifest, const char *key);

#endif
