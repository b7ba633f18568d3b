/*
 * The spec served at /v1/openapi.yaml is exactly api/openapi.yaml (run
 * api/openapi_gen.sh after editing the YAML), and every route the router
 * knows is documented in it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "api/http.h"
#include "api/router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        fclose(f);
        return NULL;
    }
    s[n] = '\0';
    fclose(f);
    return s;
}

static void test_embedded_matches_file(void **state)
{
    char *yaml = slurp("api/openapi.yaml");
    if (yaml == NULL)
        fail_msg("run from the repository root: api/openapi.yaml not found");
    if (strcmp(yaml, jd_openapi_yaml) != 0)
        fail_msg("api/openapi.c is stale: run api/openapi_gen.sh");
    free(yaml);
}

static void test_every_route_documented(void **state)
{
    for (int r = JD_ROUTE_NONE + 1; r < JD_ROUTE_COUNT; r++) {
        char key[128];
        snprintf(key, sizeof key, "\n  %s:\n", jd_route_name((enum jd_route)r));
        /* OpenAPI has no rest-of-path template: a final "*" is "{path}" there */
        char *star = strstr(key, "*:");
        if (star != NULL) {
            memmove(star + 6, star + 1, strlen(star + 1) + 1);
            memcpy(star, "{path}", 6);
        }
        if (strstr(jd_openapi_yaml, key) == NULL)
            fail_msg("route %s missing from api/openapi.yaml", jd_route_name((enum jd_route)r));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedded_matches_file),
        cmocka_unit_test(test_every_route_documented),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
