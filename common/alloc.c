/*
 * jd_x* allocators: abort on out-of-memory with a message naming the size;
 * object caches (alloc.h).
 */
#include "common/alloc.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void oom(size_t n)
{
    fprintf(stderr, "jackdaw: out of memory allocating %zu bytes\n", n);
    abort();
}

void *jd_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom(n);
    return p;
}

void *jd_xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        oom(count * size);
    return p;
}

void *jd_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom(n);
    return q;
}

char *jd_xstrdup(const char *s)
{
    return s ? jd_xstrndup(s, strlen(s)) : NULL;
}

char *jd_xstrndup(const char *s, size_t n)
{
    if (!s)
        return NULL;
    char *p = jd_xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *jd_xasprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        oom(0);
    char *p = jd_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define JD_OBJCACHE_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define JD_OBJCACHE_OFF 1
#endif
#endif

#define POOL_MAX 1024 /* blocks a cache's shared pool keeps; more go back to malloc */

struct jd_objcache {
    size_t size;
    pthread_mutex_t mu;
    void *pool; /* blocks linked through their first word */
    unsigned npool;
};

static struct jd_objcache caches[JD_OC_SLOTS] = {
    [0 ... JD_OC_SLOTS - 1] = {.mu = PTHREAD_MUTEX_INITIALIZER},
};

struct jd_objcache *jd_objcache(enum jd_objcache_slot slot, size_t size)
{
    struct jd_objcache *c = &caches[slot];
    /* Every caller passes the same size for a slot; blocks hold a pointer. */
    if (size < sizeof(void *))
        size = sizeof(void *);
    __atomic_store_n(&c->size, size, __ATOMIC_RELAXED);
    return c;
}

size_t jd_objcache_release(void)
{
    size_t n = 0;
    for (int i = 0; i < JD_OC_SLOTS; i++) {
        struct jd_objcache *c = &caches[i];
        pthread_mutex_lock(&c->mu);
        void *chain = c->pool;
        c->pool = NULL;
        c->npool = 0;
        pthread_mutex_unlock(&c->mu);
        while (chain) {
            void *next = *(void **)chain;
            free(chain);
            chain = next;
            n++;
        }
    }
    return n;
}

#ifdef JD_OBJCACHE_OFF
void *jd_objcache_calloc(struct jd_objcache *c)
{
    return jd_xcalloc(1, __atomic_load_n(&c->size, __ATOMIC_RELAXED));
}

void jd_objcache_free(struct jd_objcache *c, void *p)
{
    (void)c;
    free(p);
}
#else
struct mag {
    void *head;
    unsigned n;
};
static _Thread_local struct mag tls_mags[JD_OC_SLOTS];
static pthread_key_t mag_key;
static pthread_once_t mag_once = PTHREAD_ONCE_INIT;
static _Thread_local bool tls_registered;

/* Detach up to n blocks from the front of *head (count *cnt) as a chain. */
static void *take_chain(void **head, unsigned *cnt, unsigned n, unsigned *got)
{
    void *first = *head, *last = NULL, *p = first;
    unsigned k = 0;
    while (p && k < n) {
        last = p;
        p = *(void **)p;
        k++;
    }
    if (last)
        *(void **)last = NULL;
    *head = p;
    *cnt -= k;
    *got = k;
    return k ? first : NULL;
}

/* Give a chain of n blocks to c's pool; what it cannot keep is freed. */
static void pool_put(struct jd_objcache *c, void *chain, unsigned n)
{
    pthread_mutex_lock(&c->mu);
    while (chain && c->npool < POOL_MAX) {
        void *next = *(void **)chain;
        *(void **)chain = c->pool;
        c->pool = chain;
        c->npool++;
        chain = next;
        n--;
    }
    pthread_mutex_unlock(&c->mu);
    while (chain) {
        void *next = *(void **)chain;
        free(chain);
        chain = next;
    }
    (void)n;
}

/* Thread exit: every magazine back to its pool. A block freed by a later
 * destructor registers the thread again (glibc runs destructors again for
 * a key set during that round), so it is not left behind. */
static void mags_flush(void *unused)
{
    (void)unused;
    tls_registered = false;
    for (int i = 0; i < JD_OC_SLOTS; i++) {
        struct mag *m = &tls_mags[i];
        if (m->n)
            pool_put(&caches[i], m->head, m->n);
        m->head = NULL;
        m->n = 0;
    }
}

static void mag_key_make(void)
{
    (void)pthread_key_create(&mag_key, mags_flush);
}

static struct mag *my_mag(struct jd_objcache *c)
{
    if (!tls_registered) {
        tls_registered = true;
        pthread_once(&mag_once, mag_key_make);
        (void)pthread_setspecific(mag_key, tls_mags); /* non-NULL: the destructor runs */
    }
    return &tls_mags[c - caches];
}

void *jd_objcache_calloc(struct jd_objcache *c)
{
    struct mag *m = my_mag(c);
    size_t size = __atomic_load_n(&c->size, __ATOMIC_RELAXED);
    if (!m->n) {
        pthread_mutex_lock(&c->mu);
        unsigned got = 0;
        m->head = take_chain(&c->pool, &c->npool, JD_OBJCACHE_MAG / 2, &got);
        m->n = got;
        pthread_mutex_unlock(&c->mu);
        if (!m->n)
            return jd_xcalloc(1, size);
    }
    void *p = m->head;
    m->head = *(void **)p;
    m->n--;
    memset(p, 0, size);
    return p;
}

void jd_objcache_free(struct jd_objcache *c, void *p)
{
    if (!p)
        return;
    struct mag *m = my_mag(c);
    if (m->n >= JD_OBJCACHE_MAG) {
        unsigned got = 0;
        void *chain = take_chain(&m->head, &m->n, JD_OBJCACHE_MAG / 2, &got);
        pool_put(c, chain, got);
    }
    *(void **)p = m->head;
    m->head = p;
    m->n++;
}
#endif
