/*
 * Weak stand-ins for the store's cluster functions (storage/store.h, "the
 * cluster"), with the answers a SQLite store gives, so the server links
 * before the storage half of issue 16 phase 2 lands. The storage layer's
 * strong definitions replace these at link time; delete this file once
 * they are merged.
 */
#include "common/error.h"
#include "storage/store.h"

#include <string.h>

__attribute__((weak)) bool jd_store_clustered(const struct jd_store *s)
{
    (void)s;
    return false;
}

__attribute__((weak)) int64_t jd_store_node_id(const struct jd_store *s)
{
    (void)s;
    return 0;
}

__attribute__((weak)) int jd_store_cluster_start(struct jd_store *s,
                                                 const struct jd_store_cluster_hooks *h)
{
    (void)s;
    (void)h;
    return JD_EINVAL;
}

__attribute__((weak)) bool jd_store_lease_ok(struct jd_store *s)
{
    (void)s;
    return true;
}

__attribute__((weak)) bool jd_store_is_leader(struct jd_store *s)
{
    (void)s;
    return true;
}

__attribute__((weak)) bool jd_store_healthy(struct jd_store *s)
{
    (void)s;
    return true;
}

__attribute__((weak)) int jd_store_claim(struct jd_store *s, unsigned limit, jd_store_job_fn fn,
                                         void *arg, size_t *n)
{
    (void)s;
    (void)limit;
    (void)fn;
    (void)arg;
    *n = 0;
    return JD_EINVAL;
}

__attribute__((weak)) int jd_store_requests(struct jd_store *s, int64_t after_id, unsigned limit,
                                            struct jd_job_request **rows, size_t *n)
{
    (void)s;
    (void)after_id;
    (void)limit;
    *rows = NULL;
    *n = 0;
    return JD_EINVAL;
}

__attribute__((weak)) void jd_job_requests_free(struct jd_job_request *rows, size_t n)
{
    (void)rows;
    (void)n;
}

__attribute__((weak)) void jd_store_cluster_stats(struct jd_store *s, struct jd_cluster_stats *out)
{
    (void)s;
    memset(out, 0, sizeof *out);
}
