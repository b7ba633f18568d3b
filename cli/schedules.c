/*
 * jackdaw schedules: list, show, create or replace, pause, resume, trigger,
 * delete a schedule and read its history, through /v1/schedules. Single
 * threaded (main's thread).
 */
#include "cli/schedules.h"

#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/table.h"
#include "common/alloc.h"

/* "cron EXPR" or "every DUR" for a table cell. */
static void timetable(const cJSON *s, char *buf, size_t n)
{
    const char *cron = jd_cli_str(s, "cron"), *every = jd_cli_str(s, "every");
    if (cron)
        snprintf(buf, n, "cron %s", cron);
    else if (every)
        snprintf(buf, n, "every %s", every);
    else
        buf[0] = '\0';
}

static const char *first_next(const cJSON *s)
{
    const cJSON *nf = cJSON_GetArrayItem(cJSON_GetObjectItem(s, "next_fire_times"), 0);
    return cJSON_IsString(nf) ? nf->valuestring : NULL;
}

/* A schedule for people: one "key<TAB>value" line per field present. */
static void print_schedule(const cJSON *s)
{
    struct jd_cli_table t;
    jd_cli_table_init(&t, 2);
    char tt[512];
    timetable(s, tt, sizeof tt);
    const char *rows[][2] = {
        {"id", jd_cli_str(s, "id")},
        {"state", jd_cli_str(s, "state")},
        {"timetable", tt[0] ? tt : NULL},
        {"timezone", jd_cli_str(s, "timezone")},
        {"overlap", jd_cli_str(s, "overlap")},
        {"catchup", jd_cli_str(s, "catchup")},
        {"start_at", jd_cli_str(s, "start_at")},
        {"end_at", jd_cli_str(s, "end_at")},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        if (rows[i][1])
            jd_cli_table_row(&t, rows[i]);
    const cJSON *nf;
    cJSON_ArrayForEach(nf, cJSON_GetObjectItem(s, "next_fire_times"))
    {
        if (cJSON_IsString(nf))
            jd_cli_table_row(&t, (const char *[]){"next_fire", nf->valuestring});
    }
    const cJSON *last = cJSON_GetObjectItem(s, "last_fire");
    if (cJSON_IsObject(last)) {
        char v[256], id[64];
        jd_cli_num_or_str(last, "job_id", id, sizeof id);
        snprintf(v, sizeof v, "%s %s job %s",
                 jd_cli_str(last, "time") ? jd_cli_str(last, "time") : "",
                 jd_cli_str(last, "outcome") ? jd_cli_str(last, "outcome") : "", id[0] ? id : "-");
        jd_cli_table_row(&t, (const char *[]){"last_fire", v});
    }
    const cJSON *counts = cJSON_GetObjectItem(s, "counts");
    if (cJSON_IsObject(counts)) {
        char f[32], k[32], v[80];
        jd_cli_num_or_str(counts, "fires", f, sizeof f);
        jd_cli_num_or_str(counts, "skips", k, sizeof k);
        snprintf(v, sizeof v, "%s fires, %s skips", f[0] ? f : "0", k[0] ? k : "0");
        jd_cli_table_row(&t, (const char *[]){"counts", v});
    }
    jd_cli_table_json_rows(&t, s, (const char *[]){"job", "labels"}, 2);
    jd_cli_table_print(&t, stdout);
    jd_cli_table_free(&t);
}

/* method /v1/schedules/ID[suffix] with body; prints the answer as a schedule
 * (or as a job's id for trigger, or nothing for a 204). */
static int one(const char *method, const char *id, const char *suffix, const char *body)
{
    char *e = jd_cli_escape(id);
    char *path = jd_xasprintf("/v1/schedules/%s%s", e, suffix);
    free(e);
    struct jd_cli_resp r;
    int rc = jd_cli_request(&jd_cli, method, path, body, 60, &r);
    free(path);
    int ex = jd_cli_report(&r, rc);
    if (ex == JD_EX_OK && r.len > 0) {
        cJSON *j = cJSON_Parse(r.body);
        if (!j) {
            fprintf(stderr, "jackdaw: the server's answer is not JSON\n");
            ex = JD_EX_SERVER;
        } else if (jd_cli_json) {
            jd_cli_print_json(j);
        } else if (strcmp(suffix, "/trigger") == 0) {
            char jid[64];
            jd_cli_num_or_str(j, "id", jid, sizeof jid);
            puts(jid);
        } else {
            print_schedule(j);
        }
        cJSON_Delete(j);
    }
    free(r.body);
    return ex;
}

static void schedule_row(const cJSON *s, char (*buf)[JD_CLI_CELL], const char **cells)
{
    timetable(s, buf[2], sizeof buf[2]);
    jd_cli_num_or_str(cJSON_GetObjectItem(s, "counts"), "fires", buf[5], sizeof buf[5]);
    const char *tz = jd_cli_str(s, "timezone");
    cells[0] = jd_cli_str(s, "id");
    cells[1] = jd_cli_str(s, "state");
    cells[2] = buf[2];
    cells[3] = tz ? tz : "UTC";
    cells[4] = first_next(s);
    cells[5] = buf[5][0] ? buf[5] : "0";
}

static void event_row(const cJSON *ev, char (*buf)[JD_CLI_CELL], const char **cells)
{
    jd_cli_num_or_str(ev, "seq", buf[0], sizeof buf[0]);
    jd_cli_num_or_str(ev, "job_id", buf[4], sizeof buf[4]);
    cells[0] = buf[0];
    cells[1] = jd_cli_str(ev, "time");
    cells[2] = jd_cli_str(ev, "kind");
    cells[3] = jd_cli_str(ev, "fire_time");
    cells[4] = buf[4][0] ? buf[4] : NULL;
}

static int cmd_ls(int argc, char **argv)
{
    const char *limit = NULL, *cursor = NULL;
    for (int i = 2; i < argc; i++) {
        if (jd_cli_is_help(argv[i]))
            return jd_cli_usage(jd_schedules_usage, 1);
        if (i + 1 < argc && strcmp(argv[i], "--limit") == 0)
            limit = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--cursor") == 0)
            cursor = argv[++i];
        else
            return jd_cli_usage(jd_schedules_usage, 0);
    }
    char *el = jd_cli_escape(limit ? limit : "100"), *ec = cursor ? jd_cli_escape(cursor) : NULL;
    char *path = ec ? jd_xasprintf("/v1/schedules?limit=%s&cursor=%s", el, ec)
                    : jd_xasprintf("/v1/schedules?limit=%s", el);
    free(el);
    free(ec);
    int ex = jd_cli_list(path, "schedules", 6,
                         (const char *[]){"ID", "STATE", "TIMETABLE", "TIMEZONE", "NEXT", "FIRES"},
                         schedule_row);
    free(path);
    return ex;
}

static int cmd_events(const char *id)
{
    char *e = jd_cli_escape(id);
    char *path = jd_xasprintf("/v1/schedules/%s/events", e);
    free(e);
    int ex = jd_cli_list(path, "events", 5,
                         (const char *[]){"SEQ", "TIME", "KIND", "FIRE_TIME", "JOB"}, event_row);
    free(path);
    return ex;
}

/* put [ID] FILE: the id comes from the command line or the file's "id"
 * member (which is not part of the definition the server takes). */
static int cmd_put(int argc, char **argv)
{
    if (argc != 3 && argc != 4)
        return jd_cli_usage(jd_schedules_usage, 0);
    const char *file = argv[argc - 1];
    char *text = jd_cli_read_file(file);
    if (!text)
        return JD_EX_USAGE;
    cJSON *def = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(def)) {
        fprintf(stderr, "jackdaw: %s: not a JSON object\n", file);
        cJSON_Delete(def);
        return JD_EX_USAGE;
    }
    cJSON *fid = cJSON_DetachItemFromObjectCaseSensitive(def, "id");
    const char *id = argc == 4 ? argv[2] : cJSON_GetStringValue(fid);
    int ex;
    if (!id || !*id) {
        fprintf(stderr, "jackdaw: no schedule id: give it as `put ID FILE` or as \"id\" in %s\n",
                file);
        ex = JD_EX_USAGE;
    } else {
        char *body = cJSON_PrintUnformatted(def);
        ex = one("PUT", id, "", body);
        free(body);
    }
    cJSON_Delete(fid);
    cJSON_Delete(def);
    return ex;
}

int jd_schedules_main(int argc, char **argv)
{
    if (argc < 2 || jd_cli_is_help(argv[1]))
        return jd_cli_usage(jd_schedules_usage, argc >= 2);
    const char *sub = argv[1];
    if (strcmp(sub, "ls") == 0)
        return cmd_ls(argc, argv);
    if (argc > 2 && jd_cli_is_help(argv[2]))
        return jd_cli_usage(jd_schedules_usage, 1);
    if (strcmp(sub, "put") == 0)
        return cmd_put(argc, argv);
    if (argc != 3 || argv[2][0] == '-')
        return jd_cli_usage(jd_schedules_usage, 0);
    const char *id = argv[2];
    static const struct {
        const char *name, *method, *suffix;
    } simple[] = {
        {"get", "GET", ""},
        {"pause", "POST", "/pause"},
        {"resume", "POST", "/resume"},
        {"trigger", "POST", "/trigger"},
        {"rm", "DELETE", ""},
    };
    for (size_t i = 0; i < sizeof simple / sizeof *simple; i++)
        if (strcmp(sub, simple[i].name) == 0)
            return one(simple[i].method, id, simple[i].suffix, NULL);
    if (strcmp(sub, "events") == 0)
        return cmd_events(id);
    fprintf(stderr, "jackdaw: unknown schedules command \"%s\"\n", sub);
    return jd_cli_usage(jd_schedules_usage, 0);
}
