/*
 * libFuzzer harness for the job-definition parser/validator behind POST
 * /v1/jobs: jd_jobs_validate on a real job layer (temporary database, the
 * built-in plugins from $JD_FUZZ_PLUGINS so handler names resolve).
 * Invariants: only the documented codes come back, a rejection carries a
 * message and a pointer that is empty or starts with '/', and anything
 * accepted is well-formed JSON. The job layer is created once in
 * LLVMFuzzerInitialize; calls come from libFuzzer's one thread.
 */
#include "common/error.h"
#include "common/log.h"
#include "server/jobs.h"
#include "storage/store.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct jd_store *store;
static struct jd_jobs *jobs;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    jd_log_set_level(JD_LOG_OFF);
    char dir[] = "/tmp/jackdaw-fuzz.XXXXXX";
    if (mkdtemp(dir) == NULL)
        abort();
    char path[64];
    snprintf(path, sizeof path, "%s/fuzz.db", dir);
    struct jd_store_config sc = {.path = path, .sync_full = false};
    struct jd_error err = {0};
    if (jd_store_open(&sc, &store, &err) != 0) {
        fprintf(stderr, "store: %s\n", err.message);
        abort();
    }
    struct jd_jobs_config jc = {
        .store = store, .workers = 1, .plugin_dir = getenv("JD_FUZZ_PLUGINS")};
    if (jd_jobs_create(&jc, &jobs, &err) != 0) {
        fprintf(stderr, "jobs: %s\n", err.message);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct jd_error err;
    memset(&err, 0, sizeof err);
    int rc = jd_jobs_validate(jobs, (const char *)data, size, &err);
    switch (rc) {
    case 0: {
        cJSON *o = cJSON_ParseWithLength((const char *)data, size);
        if (o == NULL)
            abort(); /* accepted something that is not JSON */
        cJSON_Delete(o);
        break;
    }
    case JD_EPARSE:
    case JD_EINVAL:
    case JD_ETOOBIG:
        if (err.message[0] == '\0')
            abort();
        if (err.pointer[0] != '\0' && err.pointer[0] != '/')
            abort();
        if (memchr(err.message, '\0', sizeof err.message) == NULL)
            abort();
        break;
    default:
        abort();
    }
    return 0;
}
