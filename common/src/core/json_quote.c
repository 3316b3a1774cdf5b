/* JSON string literals (json_quote.h). */
#include "core/json_quote.h"

#include <stdio.h>
#include <stdlib.h>

/* Bytes the escape of byte c takes. */
static size_t escaped_len(unsigned char c) {
    return c == '"' || c == '\\' ? 2 : c < 0x20 ? 6 : 1;
}

char *ct__json_quote(const char *s) {
    size_t n = 2;
    for (const char *p = s; *p; p++) {
        n += escaped_len((unsigned char)*p);
    }
    char *out = malloc(n + 1), *w = out;
    if (out == NULL) {
        return NULL;
    }
    *w++ = '"';
    for (const char *p = s; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') {
            *w++ = '\\';
            *w++ = (char)c;
        } else if (c < 0x20) {
            w += snprintf(w, 7, "\\u%04x", c);
        } else {
            *w++ = (char)c;
        }
    }
    *w++ = '"';
    *w = '\0';
    return out;
}
