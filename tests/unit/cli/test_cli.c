/*
 * Unit tests for cli/'s pure helpers: the aligned table, path escaping, and
 * how a worker turns a program's stdout into a task result.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/client.h"
#include "cli/table.h"
#include "cli/work.h"

static char *render(const struct jd_cli_table *t)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    jd_cli_table_print(t, f);
    fclose(f);
    return buf;
}

static void test_table_pads_columns_and_separates_with_tabs(void **state)
{
    (void)state;
    struct jd_cli_table t;
    jd_cli_table_init(&t, 3);
    jd_cli_table_row(&t, (const char *[]){"ID", "STATE", "QUEUE"});
    jd_cli_table_row(&t, (const char *[]){"12345", "ok", "default"});
    char *s = render(&t);
    assert_string_equal(s, "ID   \tSTATE\tQUEUE\n12345\tok   \tdefault\n");
    free(s);
    jd_cli_table_free(&t);
}

static void test_table_cells_cannot_break_columns(void **state)
{
    (void)state;
    struct jd_cli_table t;
    jd_cli_table_init(&t, 2);
    jd_cli_table_row(&t, (const char *[]){"a\tb", NULL});
    jd_cli_table_row(&t, (const char *[]){"x\ny", ""});
    char *s = render(&t);
    assert_string_equal(s, "a b\t-\nx y\t-\n");
    free(s);
    jd_cli_table_free(&t);
}

static void test_escape_keeps_unreserved_only(void **state)
{
    (void)state;
    char *e = jd_cli_escape("a b/c?d=1&é");
    assert_string_equal(e, "a%20b%2Fc%3Fd%3D1%26%C3%A9");
    free(e);
}

static void test_result_json_or_text(void **state)
{
    (void)state;
    cJSON *j = jd_work_result("{\"a\":1}\n", 8);
    assert_true(cJSON_IsObject(j));
    assert_int_equal(cJSON_GetObjectItem(j, "a")->valueint, 1);
    cJSON_Delete(j);
    j = jd_work_result("hello world\n", 12);
    assert_true(cJSON_IsString(j));
    assert_string_equal(j->valuestring, "hello world");
    cJSON_Delete(j);
    j = jd_work_result("", 0);
    assert_true(cJSON_IsString(j));
    assert_string_equal(j->valuestring, "");
    cJSON_Delete(j);
    /* Only len bytes count: a buffer without a NUL is fine. */
    j = jd_work_result("42garbage", 2);
    assert_true(cJSON_IsNumber(j));
    assert_int_equal(j->valueint, 42);
    cJSON_Delete(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_pads_columns_and_separates_with_tabs),
        cmocka_unit_test(test_table_cells_cannot_break_columns),
        cmocka_unit_test(test_escape_keeps_unreserved_only),
        cmocka_unit_test(test_result_json_or_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
