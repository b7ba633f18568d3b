/*
 * Allocation that cannot fail: small internal allocations abort with a clear
 * message on out-of-memory (docs/architecture.md, "Code style"). Sizes a client controls must be
 * checked against their limits before they get here. Thread-safe.
 */
#ifndef JD_COMMON_ALLOC_H
#define JD_COMMON_ALLOC_H

#include <stddef.h>

void *jd_xmalloc(size_t n);
void *jd_xcalloc(size_t count, size_t size);
void *jd_xrealloc(void *p, size_t n);
/* Returns NULL for NULL; caller frees with free(). */
char *jd_xstrdup(const char *s);
char *jd_xstrndup(const char *s, size_t n);
/* printf into a fresh string; caller frees with free(). */
char *jd_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
