/* Reading a parsed JSON document: members by key and by dotted path, and values
 * shown in messages (see json.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

const json_value *json_get(const json_value *object, const char *key) {
  if (object == NULL || object->kind != JSON_OBJECT) return NULL;
  size_t n = strlen(key);
  for (size_t i = object->as.object.count; i-- > 0;) {
    const json_member *m = &object->as.object.members[i];
    if (m->key_length == n && memcmp(m->key, key, n) == 0) return m->value;
  }
  return NULL;
}

const json_value *json_path(const json_value *root, const char *path) {
  const json_value *v = root;
  char key[256];
  while (v != NULL && *path) {
    size_t n = strcspn(path, ".");
    if (n >= sizeof key) return NULL;
    memcpy(key, path, n);
    key[n] = '\0';
    path += n + (path[n] == '.');
    char *end;
    unsigned long long index = strtoull(key, &end, 10);
    if (v->kind == JSON_ARRAY && n > 0 && *end == '\0' && key[0] != '-') {
      v = index < v->as.array.count ? v->as.array.items[index] : NULL;
    } else {
      v = json_get(v, key);
    }
  }
  return v;
}

const char *json_kind_name(const json_value *value) {
  static const char *names[] = {"NoneType", "bool", "int", "float", "str", "list", "dict"};
  return value == NULL ? "nothing" : names[value->kind];
}

typedef struct {
  char *out;
  size_t size, at, limit;
} writer;

static void emit(writer *w, const char *text, size_t n) {
  for (size_t i = 0; i < n && w->at + 1 < w->size && w->at < w->limit; i++) {
    unsigned char c = (unsigned char)text[i];
    w->out[w->at++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
  }
}

static void render(writer *w, const json_value *v) {
  char number[64];
  switch (v->kind) {
    case JSON_NULL: emit(w, "null", 4); break;
    case JSON_BOOL: emit(w, v->as.boolean ? "true" : "false", v->as.boolean ? 4 : 5); break;
    case JSON_INT:
      emit(w, number, (size_t)snprintf(number, sizeof number, "%lld", (long long)v->as.integer));
      break;
    case JSON_FLOAT:
      emit(w, number, (size_t)snprintf(number, sizeof number, "%.17g", v->as.number));
      break;
    case JSON_STRING:
      emit(w, "'", 1);
      emit(w, v->as.string.text, v->as.string.length);
      emit(w, "'", 1);
      break;
    case JSON_ARRAY:
      emit(w, "[", 1);
      for (size_t i = 0; i < v->as.array.count && w->at < w->limit; i++) {
        if (i) emit(w, ", ", 2);
        render(w, v->as.array.items[i]);
      }
      emit(w, "]", 1);
      break;
    case JSON_OBJECT:
      emit(w, "{", 1);
      for (size_t i = 0; i < v->as.object.count && w->at < w->limit; i++) {
        if (i) emit(w, ", ", 2);
        emit(w, "'", 1);
        emit(w, v->as.object.members[i].key, v->as.object.members[i].key_length);
        emit(w, "': ", 3);
        render(w, v->as.object.members[i].value);
      }
      emit(w, "}", 1);
      break;
  }
}

const char *json_render(const json_value *value, char *buffer, size_t size, size_t limit) {
  writer w = {buffer, size, 0, limit};
  if (value == NULL) emit(&w, "nothing", 7);
  else render(&w, value);
  if (w.at >= limit && w.at + 4 < size) {
    memcpy(buffer + w.at, "...", 3);
    w.at += 3;
  }
  buffer[w.at] = '\0';
  return buffer;
}

int json_is_string(const json_value *value, const char *text) {
  return value != NULL && value->kind == JSON_STRING && strlen(text) == value->as.string.length &&
         memcmp(value->as.string.text, text, value->as.string.length) == 0;
}
