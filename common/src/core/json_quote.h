/* JSON string literals for what the library and the roles write as JSON (safetensors headers,
 * `ctrain predict`'s lines, ctrain-serve's error bodies): one escape rule everywhere. Internal. */
#ifndef CTRAIN_CORE_JSON_QUOTE_H
#define CTRAIN_CORE_JSON_QUOTE_H

/* s as a JSON string literal, quotes included: quotes and backslashes escaped, control bytes
 * as \u00XX, every other byte (UTF-8 text) as it is. Malloc'd (the caller frees); NULL when
 * out of memory. */
char *ct__json_quote(const char *s);

#endif
