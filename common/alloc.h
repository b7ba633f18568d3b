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

/*
 * Object caches: fixed-size blocks for objects made on one thread and freed
 * on another at a high rate (a request, a job, its write records). glibc's
 * per-thread cache holds 7 blocks a size and a cross-thread free goes to the
 * freeing thread's, so such objects mostly take its locked slow path (and a
 * block over 1 KiB consolidates the fast bins first). Here each thread keeps
 * a magazine of up to JD_OBJCACHE_MAG blocks per cache and trades half of it
 * with the cache's shared pool under a mutex when it runs empty or full: one
 * lock per JD_OBJCACHE_MAG / 2 objects. A thread's magazines go back to the
 * pool when it exits; blocks in the pool are kept until jd_objcache_release
 * (an idle server) or the process ends. Under ASan or TSan the cache is
 * calloc and free, so their checks still see every object. Thread-safe.
 */
#define JD_OBJCACHE_MAG 64
enum jd_objcache_slot { JD_OC_HTTP_REQ, JD_OC_JOB_WREC, JD_OC_SLOTS };
struct jd_objcache;
/* The cache for one kind of object: size is its size; every call names the
 * same size for a slot. */
struct jd_objcache *jd_objcache(enum jd_objcache_slot slot, size_t size);
/* A zeroed block (as jd_xcalloc(1, size)); free it with jd_objcache_free. */
void *jd_objcache_calloc(struct jd_objcache *c);
void jd_objcache_free(struct jd_objcache *c, void *p); /* p may be NULL */
/* Free the blocks every cache's shared pool holds (the threads' magazines
 * stay): after a burst they are scattered over the heap, each keeping a page
 * resident that malloc_trim could otherwise give back. Returns the number
 * of blocks freed. */
size_t jd_objcache_release(void);

#endif
