/*
 * SQLite's memory allocator: glibc malloc behind a small per-thread cache.
 *
 * Debian's libsqlite3 is built with SQLITE_OMIT_LOOKASIDE, so every cursor
 * a statement opens (~450 bytes each, one per table and index it touches),
 * every record buffer and every savepoint bitmap is a malloc and a free:
 * about 60 of each per job on the writer. A statement frees its cursors
 * together, more of one size than glibc's per-thread cache keeps (7), so
 * most of those frees and the next statement's mallocs took glibc's slow
 * path (callgrind: ~200 instructions per malloc/free pair, ~8 % of the
 * writer thread's instructions).
 *
 * Blocks of up to JD_SQLMEM_SMALL bytes come in size classes 16 bytes
 * apart; a freed block goes onto the freeing thread's list for its class,
 * up to JD_SQLMEM_KEEP bytes a class, and the next malloc of that class on
 * that thread takes it back. Larger blocks (page-cache pages) and frees
 * past the cap go straight to glibc. Every block carries an 8-byte header
 * with its class (or its size, for a large one), which xSize reads.
 *
 * A block freed on another thread than the one that allocated it is kept
 * by the freeing thread (memory is memory); each thread's cache is bounded,
 * and given back to glibc when the thread exits (a pthread key destructor)
 * or when jd_sqlite_mem_trim is called on it.
 *
 * Installed by sqlite_global_init (storage/store.c) before SQLite
 * initialises; if something else initialised SQLite first, SQLite keeps
 * its default allocator. Not installed under AddressSanitizer or
 * ThreadSanitizer builds, so they keep seeing every SQLite allocation.
 *
 * Threading: each thread touches only its own cache (thread-local);
 * install runs once (pthread_once in the caller).
 */
#include "storage/store_impl.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define JD_SQLMEM_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define JD_SQLMEM_OFF 1
#endif
#endif

#ifndef JD_SQLMEM_OFF
#define JD_SQLMEM_GRAIN 16                                    /* bytes between size classes */
#define JD_SQLMEM_SMALL 1024                                  /* largest cached block */
#define JD_SQLMEM_CLASSES (JD_SQLMEM_SMALL / JD_SQLMEM_GRAIN) /* class c: (c + 1) * 16 bytes */
#define JD_SQLMEM_KEEP 8192 /* bytes of free blocks kept per class per thread */
#define JD_SQLMEM_HDR 8     /* header: class + 1, or the size of a large block, negated */

struct sqlmem_cache {
    void *head[JD_SQLMEM_CLASSES]; /* free blocks (their headers), linked through the payload */
    uint16_t n[JD_SQLMEM_CLASSES];
    bool registered; /* the key's destructor will drain it */
};

static _Thread_local struct sqlmem_cache cache;
static pthread_key_t cache_key;

static size_t class_size(int c)
{
    return (size_t)(c + 1) * JD_SQLMEM_GRAIN;
}

/* The class of a request of n bytes (n <= JD_SQLMEM_SMALL, n > 0). */
static int class_of(size_t n)
{
    return (int)((n - 1) / JD_SQLMEM_GRAIN);
}

/* Free blocks kept per class: JD_SQLMEM_KEEP bytes' worth (set once by
 * install, before SQLite can call in). */
static uint16_t keep[JD_SQLMEM_CLASSES];

static void drain(struct sqlmem_cache *t)
{
    for (int c = 0; c < JD_SQLMEM_CLASSES; c++) {
        void *b = t->head[c];
        while (b) {
            void *next;
            memcpy(&next, (char *)b + JD_SQLMEM_HDR, sizeof next);
            free(b);
            b = next;
        }
        t->head[c] = NULL;
        t->n[c] = 0;
    }
}

static void drain_on_exit(void *arg)
{
    drain(arg);
}

static void *sqlmem_malloc(int n)
{
    if (n <= 0)
        return NULL;
    if (n > JD_SQLMEM_SMALL) {
        int64_t *b = malloc((size_t)n + JD_SQLMEM_HDR);
        if (!b)
            return NULL;
        b[0] = -(int64_t)n;
        return b + 1;
    }
    int c = class_of((size_t)n);
    void *b = cache.head[c];
    if (b) {
        memcpy(&cache.head[c], (char *)b + JD_SQLMEM_HDR, sizeof(void *));
        cache.n[c]--;
    } else {
        b = malloc(class_size(c) + JD_SQLMEM_HDR);
        if (!b)
            return NULL;
        *(int64_t *)b = c + 1;
    }
    return (char *)b + JD_SQLMEM_HDR;
}

static void sqlmem_free(void *p)
{
    if (!p)
        return;
    int64_t *b = (int64_t *)p - 1;
    int64_t h = b[0];
    if (h < 0) {
        free(b);
        return;
    }
    int c = (int)h - 1;
    if (cache.n[c] >= keep[c]) {
        free(b);
        return;
    }
    if (!cache.registered) {
        /* first block this thread keeps: drain the cache when it exits */
        cache.registered = true;
        pthread_setspecific(cache_key, &cache);
    }
    memcpy(p, &cache.head[c], sizeof(void *));
    cache.head[c] = b;
    cache.n[c]++;
}

static int sqlmem_size(void *p)
{
    if (!p)
        return 0;
    int64_t h = ((int64_t *)p)[-1];
    return h < 0 ? (int)-h : (int)class_size((int)h - 1);
}

static void *sqlmem_realloc(void *p, int n)
{
    if (!p)
        return sqlmem_malloc(n);
    if (n <= 0)
        return NULL;
    int64_t *b = (int64_t *)p - 1;
    if (b[0] < 0 && n > JD_SQLMEM_SMALL) {
        /* large to large: glibc may grow or shrink it in place */
        b = realloc(b, (size_t)n + JD_SQLMEM_HDR);
        if (!b)
            return NULL;
        b[0] = -(int64_t)n;
        return b + 1;
    }
    int have = sqlmem_size(p);
    if (b[0] > 0 && n <= JD_SQLMEM_SMALL && class_of((size_t)n) == (int)b[0] - 1)
        return p;
    void *q = sqlmem_malloc(n);
    if (!q)
        return NULL;
    memcpy(q, p, (size_t)(n < have ? n : have));
    sqlmem_free(p);
    return q;
}

static int sqlmem_roundup(int n)
{
    if (n <= 0 || n > JD_SQLMEM_SMALL)
        return n > 0 ? (n + 7) & ~7 : n;
    return (int)class_size(class_of((size_t)n));
}

static int sqlmem_init(void *arg)
{
    (void)arg;
    return SQLITE_OK;
}

static void sqlmem_shutdown(void *arg)
{
    (void)arg;
}

#endif /* JD_SQLMEM_OFF */

void jd_sqlite_mem_install(void)
{
#ifndef JD_SQLMEM_OFF
    if (getenv("JD_SQLITE_MALLOC") && strcmp(getenv("JD_SQLITE_MALLOC"), "system") == 0)
        return;
    if (pthread_key_create(&cache_key, drain_on_exit) != 0)
        return;
    for (int c = 0; c < JD_SQLMEM_CLASSES; c++)
        keep[c] = (uint16_t)(JD_SQLMEM_KEEP / class_size(c));
    static const sqlite3_mem_methods m = {
        .xMalloc = sqlmem_malloc,
        .xFree = sqlmem_free,
        .xRealloc = sqlmem_realloc,
        .xSize = sqlmem_size,
        .xRoundup = sqlmem_roundup,
        .xInit = sqlmem_init,
        .xShutdown = sqlmem_shutdown,
    };
    sqlite3_config(SQLITE_CONFIG_MALLOC, &m);
#endif
}

void jd_sqlite_mem_trim(void)
{
#ifndef JD_SQLMEM_OFF
    drain(&cache);
#endif
}
