/*
 * The README's "Job definitions" examples, run for real: every definition in
 * tests/unit/server/readme_examples.json (the README quotes them from there)
 * is submitted to a job layer with the built-in plugins from
 * $JD_BUILD/plugins, sent its message if it has one, and its final state and
 * output (a subset match) or its rejection (pointer and message) checked.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "jobs_test_util.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
    fclose(f);
    return buf;
}

/* Every member of want is in got with an equal value (objects recursively). */
static bool subset(const cJSON *want, const cJSON *got)
{
    if (cJSON_IsObject(want)) {
        if (!cJSON_IsObject(got))
            return false;
        const cJSON *w;
        cJSON_ArrayForEach(w, want)
        {
            if (!subset(w, cJSON_GetObjectItemCaseSensitive(got, w->string)))
                return false;
        }
        return true;
    }
    return got && cJSON_Compare(want, got, true);
}

static void test_readme_examples(void **state)
{
    (void)state;
    char *text = slurp("tests/unit/server/readme_examples.json");
    if (!text)
        fail_msg("run from the repository root: tests/unit/server/readme_examples.json missing");
    cJSON *examples = cJSON_Parse(text);
    free(text);
    assert_true(cJSON_IsArray(examples));
    const char *build = getenv("JD_BUILD") ? getenv("JD_BUILD") : "build";
    char plugins[256];
    snprintf(plugins, sizeof plugins, "%s/plugins", build);
    struct jd_jobs_config cfg = {
        .plugin_dir = plugins, .exec_allow = "/bin/echo,/bin/sh", .register_plugins = NULL};
    struct env e;
    memset(&e, 0, sizeof e);
    snprintf(e.dir, sizeof e.dir, "/tmp/jd_readme_test_XXXXXX");
    assert_non_null(mkdtemp(e.dir));
    snprintf(e.db, sizeof e.db, "%s/jd.db", e.dir);
    env_open_store(&e);
    cfg.store = e.store;
    cfg.workers = 2;
    struct jd_error err;
    if (jd_jobs_create(&cfg, &e.jobs, &err) != 0)
        fail_msg("create: %s", err.message);

    int n = 0;
    const cJSON *ex;
    cJSON_ArrayForEach(ex, examples)
    {
        const char *name = cJSON_GetObjectItem(ex, "name")->valuestring;
        char *def = cJSON_PrintUnformatted(cJSON_GetObjectItem(ex, "definition"));
        const cJSON *experr = cJSON_GetObjectItem(ex, "expect_error");
        if (experr) {
            jd_error_clear(&err);
            int rc = jd_jobs_validate(e.jobs, def, strlen(def), &err);
            if (rc != JD_EINVAL ||
                strcmp(err.pointer, cJSON_GetObjectItem(experr, "pointer")->valuestring) != 0 ||
                strcmp(err.message, cJSON_GetObjectItem(experr, "message")->valuestring) != 0)
                fail_msg("%s: got %d %s %s", name, rc, err.pointer, err.message);
            free(def);
            n++;
            continue;
        }
        int64_t id = submit(e.jobs, def);
        free(def);
        const cJSON *msg = cJSON_GetObjectItem(ex, "message");
        if (msg) {
            cJSON_Delete(wait_state(e.jobs, id, "waiting", 5000));
            char *m = cJSON_PrintUnformatted(msg);
            struct action_wait aw;
            action_wait_init(&aw);
            assert_int_equal(jd_jobs_message(e.jobs, id, m, strlen(m), action_cb, &aw, &err), 0);
            action_wait_done(&aw);
            free(m);
        }
        cJSON *job = wait_terminal(e.jobs, id, 10000);
        const cJSON *want = cJSON_GetObjectItem(ex, "expect");
        cJSON *got = cJSON_CreateObject();
        cJSON_AddItemToObject(got, "state", cJSON_Duplicate(cJSON_GetObjectItem(job, "state"), 1));
        cJSON_AddItemToObject(got, "output",
                              cJSON_Duplicate(cJSON_GetObjectItem(job, "output"), 1));
        cJSON_AddItemToObject(got, "error", cJSON_Duplicate(cJSON_GetObjectItem(job, "error"), 1));
        if (!subset(want, got)) {
            char *g = cJSON_PrintUnformatted(got);
            char *w = cJSON_PrintUnformatted(want);
            fail_msg("%s:\n  want %s\n  got  %s", name, w, g);
        }
        cJSON_Delete(got);
        cJSON_Delete(job);
        n++;
    }
    assert_true(n >= 6);
    cJSON_Delete(examples);
    env_down(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readme_examples),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
