/*
 * The pieces every jackdaw subcommand shares (see cli.h). Single threaded.
 */
#include "cli/cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"

struct jd_cli_conn jd_cli;
int jd_cli_json;

int jd_cli_usage(const char *text, int to_stdout)
{
    fputs(text, to_stdout ? stdout : stderr);
    return to_stdout ? JD_EX_OK : JD_EX_USAGE;
}

int jd_cli_is_help(const char *a)
{
    return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

/* Report a failed or refused answer; returns the exit code it maps to. */
int jd_cli_report(const struct jd_cli_resp *r, int rc)
{
    if (rc != 0 || r->status == 0) {
        fprintf(stderr, "jackdaw: cannot reach %s: %s\n", jd_cli.url, r->err);
        return JD_EX_SERVER;
    }
    if (r->truncated) {
        fprintf(stderr, "jackdaw: %s\n", r->err);
        return JD_EX_SERVER;
    }
    if (r->status >= 200 && r->status < 300)
        return JD_EX_OK;
    cJSON *p = cJSON_Parse(r->body);
    const char *title = cJSON_GetStringValue(cJSON_GetObjectItem(p, "title"));
    const char *detail = cJSON_GetStringValue(cJSON_GetObjectItem(p, "detail"));
    const char *ptr = cJSON_GetStringValue(cJSON_GetObjectItem(p, "pointer"));
    if (title || detail)
        fprintf(stderr, "jackdaw: %ld %s%s%s%s%s\n", r->status, title ? title : "",
                detail ? ": " : "", detail ? detail : "", ptr && *ptr ? " at " : "",
                ptr && *ptr ? ptr : "");
    else
        fprintf(stderr, "jackdaw: HTTP %ld\n", r->status);
    cJSON_Delete(p);
    return r->status < 500 ? JD_EX_REFUSED : JD_EX_SERVER;
}

/* One request; on success *out is the parsed JSON (caller frees with
 * cJSON_Delete) and raw the body (caller frees). */
int jd_cli_call(const char *method, const char *path, const char *body, long timeout_s, cJSON **out,
                char **raw)
{
    struct jd_cli_resp r;
    int rc = jd_cli_request(&jd_cli, method, path, body, timeout_s, &r);
    int ex = jd_cli_report(&r, rc);
    if (ex == JD_EX_OK && out) {
        *out = cJSON_Parse(r.body);
        if (!*out) {
            fprintf(stderr, "jackdaw: the server's answer is not JSON\n");
            ex = JD_EX_SERVER;
        }
    }
    if (ex == JD_EX_OK && raw) {
        *raw = r.body;
        r.body = NULL;
    }
    free(r.body);
    return ex;
}

const char *jd_cli_str(const cJSON *o, const char *k)
{
    return cJSON_GetStringValue(cJSON_GetObjectItem(o, k));
}

void jd_cli_num_or_str(const cJSON *o, const char *k, char *buf, size_t n)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    if (cJSON_IsNumber(v))
        snprintf(buf, n, "%.0f", v->valuedouble);
    else if (cJSON_IsString(v))
        snprintf(buf, n, "%s", v->valuestring);
    else
        buf[0] = '\0';
}

void jd_cli_table_json_rows(struct jd_cli_table *t, const cJSON *o, const char *const *keys,
                            size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetObjectItem(o, keys[i]);
        if (v && !cJSON_IsNull(v)) {
            char *txt = cJSON_PrintUnformatted(v);
            jd_cli_table_row(t, (const char *[]){keys[i], txt});
            free(txt);
        }
    }
}

void jd_cli_print_json(const cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    if (s)
        puts(s);
    free(s);
}

/* "--wait" with an optional duration: DUR or 1h by default for submit. */
int jd_cli_parse_dur(const char *s, int64_t *ms)
{
    if (jd_duration_parse(s, ms) != 0 || *ms < 0) {
        fprintf(stderr, "jackdaw: bad duration \"%s\" (examples: 30s, 500ms, 2m, 1h)\n", s);
        return -1;
    }
    return 0;
}

static char *read_all(FILE *f)
{
    size_t len = 0, cap = 4096;
    char *p = jd_xmalloc(cap);
    size_t n;
    while ((n = fread(p + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len > JD_CLI_BODY_MAX)
            break;
        if (cap - len - 1 == 0) {
            cap *= 2;
            p = jd_xrealloc(p, cap);
        }
    }
    p[len] = '\0';
    if (len > JD_CLI_BODY_MAX || ferror(f)) {
        free(p);
        return NULL;
    }
    return p;
}

char *jd_cli_read_file(const char *file)
{
    FILE *f = strcmp(file, "-") == 0 ? stdin : fopen(file, "rb");
    if (!f) {
        fprintf(stderr, "jackdaw: %s: %s\n", file, strerror(errno));
        return NULL;
    }
    char *text = read_all(f);
    if (f != stdin)
        fclose(f);
    if (!text)
        fprintf(stderr, "jackdaw: %s: unreadable or larger than %u bytes\n", file, JD_CLI_BODY_MAX);
    return text;
}

int jd_cli_list(const char *path, const char *member, int ncols, const char *const *header,
                jd_cli_row_fn *row)
{
    cJSON *j = NULL;
    int ex = jd_cli_call("GET", path, NULL, 60, &j, NULL);
    if (ex == JD_EX_OK && jd_cli_json) {
        jd_cli_print_json(j);
    } else if (ex == JD_EX_OK) {
        struct jd_cli_table t;
        jd_cli_table_init(&t, ncols);
        jd_cli_table_row(&t, header);
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(j, member))
        {
            char buf[JD_CLI_TABLE_COLS][JD_CLI_CELL];
            const char *cells[JD_CLI_TABLE_COLS];
            row(e, buf, cells);
            jd_cli_table_row(&t, cells);
        }
        jd_cli_table_print(&t, stdout);
        jd_cli_table_free(&t);
        const char *next = jd_cli_str(j, "next_cursor");
        if (next)
            fprintf(stderr, "more: --cursor %s\n", next);
    }
    cJSON_Delete(j);
    return ex;
}
