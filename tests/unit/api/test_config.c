/*
 * Configuration: defaults, JACKDAW_* variables, flags winning over
 * variables, both flag spellings, and clear errors for bad values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/log.h"
#include "server/config.h"

#include <stdlib.h>
#include <string.h>

static int clear_env(void **state)
{
    const char *vars[] = {"JACKDAW_LISTEN",       "JACKDAW_DB",           "JACKDAW_TOKEN",
                          "JACKDAW_WORKERS",      "JACKDAW_MAX_BODY",     "JACKDAW_SYNC",
                          "JACKDAW_RETENTION",    "JACKDAW_PIN_WORKERS",  "JACKDAW_EXEC_ENV_ALLOW",
                          "JACKDAW_EXEC_TIMEOUT", "JACKDAW_HTTP_TIMEOUT", NULL};
    for (int i = 0; vars[i]; i++)
        unsetenv(vars[i]);
    return 0;
}

static void test_defaults(void **state)
{
    struct jd_config c;
    struct jd_error err = {0};
    char *argv[] = {"jackdawd", NULL};
    assert_int_equal(jd_config_parse(&c, 1, argv, "/opt/plugins", &err), 0);
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.port, 8080);
    assert_string_equal(c.db, "./data/jackdaw.db");
    assert_string_equal(c.plugin_dir, "/opt/plugins");
    assert_true(c.sync_full);
    assert_false(c.pin_workers);
    assert_null(c.token);
    assert_int_equal(c.max_body, 4u << 20);
    assert_int_equal(c.log_level, JD_LOG_INFO);
    assert_int_equal(c.conn_timeout_s, 30);
    assert_int_equal(c.max_parked, 512);
    assert_int_equal(c.max_schedules, 10000);
    assert_null(c.exec_env_allow);               /* exec's deny-list applies */
    assert_int_equal(c.exec_timeout_ms, 600000); /* every exec and http call has a deadline */
    assert_int_equal(c.http_timeout_ms, 60000);
    assert_int_equal(c.lease_ms, 10000); /* a cluster node's lease */
    assert_int_equal(c.db_readers, 16);  /* PostgreSQL read connections per node */
    assert_int_equal(c.db_reader_idle_ms, 60000);
    assert_int_equal(c.db_connect_wait_ms, 30000); /* a node started before its database */
    assert_false(c.help);
    jd_config_free(&c);
}

static void test_env_then_flags(void **state)
{
    setenv("JACKDAW_LISTEN", "0.0.0.0:9000", 1);
    setenv("JACKDAW_TOKEN", "fromenv", 1);
    setenv("JACKDAW_DB", "/tmp/env.db", 1);
    setenv("JACKDAW_PIN_WORKERS", "on", 1);
    struct jd_config c;
    struct jd_error err = {0};
    char *argv[] = {"jackdawd",         "--db",           "/tmp/flag.db", "--workers=3", "--sync",
                    "normal",           "--retention",    "7d",           "--max-body",  "64k",
                    "--log-level=warn", "--conn-timeout", "1500ms",       NULL};
    assert_int_equal(jd_config_parse(&c, 13, argv, NULL, &err), 0);
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.port, 9000);
    assert_string_equal(c.token, "fromenv");
    assert_string_equal(c.db, "/tmp/flag.db"); /* the flag wins */
    assert_int_equal(c.workers, 3);
    assert_true(c.pin_workers); /* from JACKDAW_PIN_WORKERS */
    assert_false(c.sync_full);
    assert_int_equal(c.retention_ms, 7LL * 86400 * 1000);
    assert_int_equal(c.max_body, 64 * 1024);
    assert_int_equal(c.log_level, JD_LOG_WARN);
    assert_int_equal(c.conn_timeout_s, 2); /* rounded up to whole seconds */
    jd_config_free(&c);
    clear_env(state);
}

static void test_bad_values(void **state)
{
    const char *cases[][2] = {
        {"--listen", "nohost"},  {"--listen", "h:99999"}, {"--listen", ":80"},
        {"--sync", "sometimes"}, {"--workers", "-1"},     {"--workers", "x"},
        {"--max-body", "0"},     {"--max-body", "12q"},   {"--retention", "soon"},
        {"--log-level", "loud"}, {"--bogus", "1"},        {"--pin-workers", "maybe"},
        {"--exec-timeout", "0"}, {"--http-timeout", "0"}, {"--exec-timeout", "soon"},
        {"--lease", "500ms"},    {"--lease", "2h"},       {"--lease", "later"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct jd_config c;
        struct jd_error err = {0};
        char *argv[] = {"jackdawd", (char *)cases[i][0], (char *)cases[i][1], NULL};
        int rc = jd_config_parse(&c, 3, argv, NULL, &err);
        if (rc != JD_EINVAL)
            fail_msg("%s %s accepted", cases[i][0], cases[i][1]);
        assert_true(strlen(err.message) > 0);
        jd_config_free(&c);
    }
    const char *waits[] = {"2h", "-1s", "soon"}; /* at most an hour of retrying */
    for (size_t i = 0; i < 3; i++) {
        struct jd_config c;
        struct jd_error err = {0};
        char *argv[] = {"jackdawd", "--db-connect-wait", (char *)waits[i], NULL};
        if (jd_config_parse(&c, 3, argv, NULL, &err) != JD_EINVAL)
            fail_msg("--db-connect-wait %s accepted", waits[i]);
        jd_config_free(&c);
    }
    struct jd_config c;
    struct jd_error err = {0};
    char *argv[] = {"jackdawd", "--db", NULL};
    assert_int_equal(jd_config_parse(&c, 2, argv, NULL, &err), JD_EINVAL);
    assert_non_null(strstr(err.message, "--db"));
    jd_config_free(&c);
}

/* The exec and http hardening options, by variable and by flag. */
static void test_plugin_limits(void **state)
{
    setenv("JACKDAW_EXEC_ENV_ALLOW", "LANG,APP_*", 1);
    setenv("JACKDAW_HTTP_TIMEOUT", "5s", 1);
    setenv("JACKDAW_DB_CONNECT_WAIT", "0", 1);
    struct jd_config c;
    struct jd_error err = {0};
    char *argv[] = {"jackdawd", "--exec-timeout", "2m", "--lease", "2s", NULL};
    assert_int_equal(jd_config_parse(&c, 5, argv, NULL, &err), 0);
    unsetenv("JACKDAW_DB_CONNECT_WAIT");
    assert_int_equal(c.lease_ms, 2000);
    assert_int_equal(c.db_connect_wait_ms, 0); /* 0: no retry, exit at once */
    assert_string_equal(c.exec_env_allow, "LANG,APP_*");
    assert_int_equal(c.exec_timeout_ms, 120000);
    assert_int_equal(c.http_timeout_ms, 5000);
    jd_config_free(&c);
    clear_env(state);
}

static void test_bad_env_named(void **state)
{
    setenv("JACKDAW_WORKERS", "many", 1);
    struct jd_config c;
    struct jd_error err = {0};
    char *argv[] = {"jackdawd", NULL};
    assert_int_equal(jd_config_parse(&c, 1, argv, NULL, &err), JD_EINVAL);
    assert_non_null(strstr(err.message, "JACKDAW_WORKERS"));
    jd_config_free(&c);
    clear_env(state);
}

static void test_listen_forms_and_help(void **state)
{
    char host[64];
    uint16_t port;
    assert_int_equal(jd_config_parse_listen("[::1]:0", host, sizeof host, &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 0);
    assert_int_equal(jd_config_parse_listen("localhost:8080", host, sizeof host, &port), 0);
    assert_string_equal(host, "localhost");
    assert_int_not_equal(jd_config_parse_listen("::1:80", host, sizeof host, &port), 0);
    struct jd_config c;
    struct jd_error err = {0};
    char *argv[] = {"jackdawd", "--help", "--token", "", NULL};
    assert_int_equal(jd_config_parse(&c, 4, argv, NULL, &err), 0);
    assert_true(c.help);
    assert_null(c.token); /* empty token: auth off */
    jd_config_free(&c);
    /* every option appears in --help */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    jd_config_usage(f, "jackdawd");
    fclose(f);
    const char *flags[] = {"--listen",       "--db",          "--workers",
                           "--plugin-dir",   "--sync",        "--token",
                           "--exec-allow",   "--http-allow",  "--retention",
                           "--max-body",     "--log-level",   "--max-connections",
                           "--conn-timeout", "--max-parked",  "--max-schedules",
                           "--pin-workers",  "JACKDAW_TOKEN", NULL};
    for (int i = 0; flags[i]; i++)
        if (strstr(text, flags[i]) == NULL)
            fail_msg("--help does not mention %s", flags[i]);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults, clear_env),
        cmocka_unit_test_setup(test_env_then_flags, clear_env),
        cmocka_unit_test_setup(test_bad_values, clear_env),
        cmocka_unit_test_setup(test_plugin_limits, clear_env),
        cmocka_unit_test_setup(test_bad_env_named, clear_env),
        cmocka_unit_test_setup(test_listen_forms_and_help, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
