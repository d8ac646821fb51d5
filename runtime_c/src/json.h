/* A small JSON reader for the package's manifest and plan.
 *
 * Our own rather than a library's: whole numbers must stay exact 64-bit integers and
 * apart from fractions (the plan's checks want "an int", as Python's `type(v) is int`),
 * duplicate keys must resolve as Python's json does (the last one), and nesting must
 * be bounded, all of which cJSON does differently; it is 400 lines. */
#ifndef EDGECV_JSON_H
#define EDGECV_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_INT, JSON_FLOAT, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_kind;

typedef struct json_value json_value;
typedef struct {
  char *key;
  size_t key_length;
  json_value *value;
} json_member;

struct json_value {
  json_kind kind;
  union {
    int boolean;
    int64_t integer;
    double number;
    struct {
      char *text; /* NUL-terminated; may hold NULs of its own (\u0000) */
      size_t length;
    } string;
    struct {
      json_value **items;
      size_t count;
    } array;
    struct {
      json_member *members;
      size_t count;
    } object;
  } as;
};

/* The value `text` holds, or NULL with the reason in `why` (with its line and column). */
json_value *json_parse(const char *text, size_t length, char *why, size_t why_size);
void json_free(json_value *value);

/* The member `key` of an object (the last of that name), NULL when absent or no object. */
const json_value *json_get(const json_value *object, const char *key);
/* A value by dotted path ("build.host.triple"; numbers index arrays), NULL if absent. */
const json_value *json_path(const json_value *root, const char *path);

/* What a value is, for messages: "str", "int", "list", ... (Python's names, as the
 * Python loader says them), and the value as compact JSON cut at `limit` bytes. */
const char *json_kind_name(const json_value *value);
const char *json_render(const json_value *value, char *buffer, size_t size, size_t limit);

/* 1 when the value is the string `text`. */
int json_is_string(const json_value *value, const char *text);

#endif
