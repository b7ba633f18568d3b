/*
 * JSON rendering of jobs, history events, handlers and queues for the HTTP
 * layer (shapes documented in jobs.h). Ids and times are strings; JSON text
 * stored in the database is embedded as JSON, not as strings.
 *
 * jd_render_job_json writes the same text as printing jd_render_job with
 * cJSON_PrintUnformatted, byte for byte, without building a tree: it is on
 * the path of every POST and every long-poll answer. It relies on stored
 * definitions being compact cJSON output (jobdef.c stores
 * jd_json_print of the parsed definition: the same bytes), so the definition and
 * its "labels" member are copied as text; a definition that does not look
 * exactly like cJSON's own output is rendered through cJSON instead.
 *
 * Threading: pure functions; safe from any thread.
 */
#include "server/jobs_impl.h"

#include "common/alloc.h"
#include "common/clock.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void jd_render_add_time(cJSON *o, const char *name, int64_t ms)
{
    if (ms <= 0) {
        cJSON_AddNullToObject(o, name);
        return;
    }
    char buf[40];
    jd_time_format(ms, buf, sizeof buf);
    cJSON_AddStringToObject(o, name, buf);
}

/* Embed JSON text (NULL or unparsable: null). */
static void add_json(cJSON *o, const char *name, const char *text)
{
    cJSON *v = text ? cJSON_Parse(text) : NULL;
    cJSON_AddItemToObject(o, name, v ? v : cJSON_CreateNull());
}

/* The fire time a schedule's job was made for, from its idempotency key
 * "schedule:<id>:<fire ms>"; 0 for a trigger ("schedule:<id>:trigger:...")
 * or anything else. */
static int64_t schedule_fire_ms(const struct jd_job *row)
{
    const char *k = row->idempotency_key;
    size_t n = strlen(row->schedule_id);
    if (!k || strncmp(k, "schedule:", 9) != 0 || strncmp(k + 9, row->schedule_id, n) != 0 ||
        k[9 + n] != ':')
        return 0;
    const char *p = k + 10 + n;
    int64_t v = 0;
    for (; *p >= '0' && *p <= '9' && v < INT64_MAX / 10 - 10; p++)
        v = v * 10 + (*p - '0');
    return *p == '\0' ? v : 0;
}

cJSON *jd_render_job(const struct jd_job *row)
{
    cJSON *o = cJSON_CreateObject();
    char id[24];
    snprintf(id, sizeof id, "%" PRId64, row->id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "state", jd_job_state_name(row->state));
    cJSON_AddStringToObject(o, "queue", row->queue ? row->queue : "default");
    cJSON_AddNumberToObject(o, "priority", (double)row->priority);
    cJSON_AddNumberToObject(o, "version", (double)row->version);
    cJSON_AddNumberToObject(o, "attempts", (double)row->attempts);
    add_json(o, "output", row->output);
    add_json(o, "error", row->error);
    cJSON *def = row->definition ? cJSON_Parse(row->definition) : NULL;
    const cJSON *labels = def ? cJSON_GetObjectItemCaseSensitive(def, "labels") : NULL;
    cJSON_AddItemToObject(o, "labels", labels ? cJSON_Duplicate(labels, 1) : cJSON_CreateObject());
    jd_render_add_time(o, "created_at", row->created_ms);
    jd_render_add_time(o, "updated_at", row->updated_ms);
    jd_render_add_time(o, "started_at", row->started_ms);
    jd_render_add_time(o, "finished_at", row->finished_ms);
    jd_render_add_time(o, "run_at", row->run_at_ms);
    cJSON_AddItemToObject(o, "definition", def ? def : cJSON_CreateNull());
    if (row->schedule_id) {
        cJSON *sc = cJSON_AddObjectToObject(o, "schedule");
        cJSON_AddStringToObject(sc, "id", row->schedule_id);
        jd_render_add_time(sc, "fire_time", schedule_fire_ms(row));
    }
    return o;
}

/* ------------------------------------------------- direct text rendering */

static void sb_reserve(struct jd_sbuf *b, size_t more)
{
    if (b->n + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more + 1)
        cap *= 2;
    b->p = jd_xrealloc(b->p, cap);
    b->cap = cap;
}

void jd_sb_put(struct jd_sbuf *b, const char *s, size_t n)
{
    sb_reserve(b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void jd_sb_puts(struct jd_sbuf *b, const char *s)
{
    jd_sb_put(b, s, strlen(s));
}

/* A JSON string, escaped exactly as cJSON prints it. */
void jd_sb_string(struct jd_sbuf *b, const char *s)
{
    sb_reserve(b, strlen(s) * 6 + 2);
    char *o = b->p + b->n;
    *o++ = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        switch (*c) {
        case '"':
            *o++ = '\\', *o++ = '"';
            break;
        case '\\':
            *o++ = '\\', *o++ = '\\';
            break;
        case '\b':
            *o++ = '\\', *o++ = 'b';
            break;
        case '\f':
            *o++ = '\\', *o++ = 'f';
            break;
        case '\n':
            *o++ = '\\', *o++ = 'n';
            break;
        case '\r':
            *o++ = '\\', *o++ = 'r';
            break;
        case '\t':
            *o++ = '\\', *o++ = 't';
            break;
        default:
            if (*c < 32) {
                o += sprintf(o, "\\u%04x", *c);
            } else {
                *o++ = (char)*c;
            }
        }
    }
    *o++ = '"';
    *o = '\0';
    b->n = (size_t)(o - b->p);
}

/* A number as cJSON prints a double holding v: integers that fit an int
 * as such, anything else through cJSON itself. */
void jd_sb_number(struct jd_sbuf *b, int64_t v)
{
    if (v >= -2147483647 - 1 && v <= 2147483647) {
        /* "%d" by hand: eleven numbers in every job rendered */
        char buf[12], *e = buf + sizeof buf, *p = e;
        uint32_t u = v < 0 ? (uint32_t)0 - (uint32_t)v : (uint32_t)v;
        do
            *--p = (char)('0' + u % 10);
        while ((u /= 10) != 0);
        if (v < 0)
            *--p = '-';
        jd_sb_put(b, p, (size_t)(e - p));
        return;
    }
    cJSON *n = cJSON_CreateNumber((double)v);
    char *t = cJSON_PrintUnformatted(n);
    jd_sb_puts(b, t);
    free(t);
    cJSON_Delete(n);
}

static void put2(char *p, int v)
{
    p[0] = (char)('0' + v / 10);
    p[1] = (char)('0' + v % 10);
}

void jd_render_time(int64_t wall_ms, char buf[32])
{
    /* Years 1970..9999 by integer arithmetic (days -> civil date, H.
     * Hinnant's algorithm); anything else through jd_time_format. */
    if (wall_ms < 0 || wall_ms >= 253402300800000LL) {
        jd_time_format(wall_ms, buf, 32);
        return;
    }
    int64_t secs = wall_ms / 1000;
    int ms = (int)(wall_ms % 1000);
    int64_t days = secs / 86400;
    int sod = (int)(secs % 86400);
    int64_t z = days + 719468;
    int64_t era = z / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    int d = (int)(doy - (153 * mp + 2) / 5 + 1);
    int m = (int)(mp < 10 ? mp + 3 : mp - 9);
    int y = (int)(yoe + era * 400 + (m <= 2));
    put2(buf, y / 100);
    put2(buf + 2, y % 100);
    buf[4] = '-';
    put2(buf + 5, m);
    buf[7] = '-';
    put2(buf + 8, d);
    buf[10] = 'T';
    put2(buf + 11, sod / 3600);
    buf[13] = ':';
    put2(buf + 14, sod / 60 % 60);
    buf[16] = ':';
    put2(buf + 17, sod % 60);
    buf[19] = '.';
    buf[20] = (char)('0' + ms / 100);
    put2(buf + 21, ms % 100);
    buf[23] = 'Z';
    buf[24] = '\0';
}

static void sb_time(struct jd_sbuf *b, const char *name, int64_t ms)
{
    jd_sb_puts(b, name);
    if (ms <= 0) {
        jd_sb_puts(b, "null");
        return;
    }
    char buf[34];
    buf[0] = '"';
    jd_render_time(ms, buf + 1);
    size_t n = strlen(buf);
    buf[n] = '"'; /* digits, '-', ':', '.', 'T', 'Z': nothing to escape */
    jd_sb_put(b, buf, n + 1);
}

/* v's digits; v is an integer-valued double below 1e15 in magnitude. */
static void sb_int_digits(struct jd_sbuf *b, double v)
{
    char buf[24], *e = buf + sizeof buf, *p = e;
    uint64_t u = (uint64_t)(v < 0 ? -v : v);
    do
        *--p = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    if (v < 0)
        *--p = '-';
    jd_sb_put(b, p, (size_t)(e - p));
}

static bool json_value(struct jd_sbuf *b, const cJSON *v)
{
    switch (v->type & 0xFF) {
    case cJSON_NULL:
        jd_sb_put(b, "null", 4);
        return true;
    case cJSON_False:
        jd_sb_put(b, "false", 5);
        return true;
    case cJSON_True:
        jd_sb_put(b, "true", 4);
        return true;
    case cJSON_Number: {
        /* cJSON prints "%1.15g" (kept when it reads back the same): for an
         * integer below 1e15 that is its digits; -0, fractions, large and
         * non-finite numbers go through cJSON itself */
        double d = v->valuedouble;
        if (d > -1e15 && d < 1e15 && d == (double)(int64_t)d && !(d == 0 && signbit(d))) {
            sb_int_digits(b, d);
            return true;
        }
        char *t = cJSON_PrintUnformatted(v);
        if (!t)
            return false;
        jd_sb_puts(b, t);
        free(t);
        return true;
    }
    case cJSON_Raw:
        if (!v->valuestring)
            return false;
        jd_sb_puts(b, v->valuestring);
        return true;
    case cJSON_String:
        jd_sb_string(b, v->valuestring ? v->valuestring : "");
        return true;
    case cJSON_Array:
    case cJSON_Object: {
        bool obj = (v->type & 0xFF) == cJSON_Object;
        jd_sb_put(b, obj ? "{" : "[", 1);
        for (const cJSON *c = v->child; c; c = c->next) {
            if (obj) {
                jd_sb_string(b, c->string ? c->string : "");
                jd_sb_put(b, ":", 1);
            }
            if (!json_value(b, c))
                return false;
            if (c->next)
                jd_sb_put(b, ",", 1);
        }
        jd_sb_put(b, obj ? "}" : "]", 1);
        return true;
    }
    default:
        return false;
    }
}

char *jd_json_print(const cJSON *v)
{
    if (!v)
        return NULL;
    struct jd_sbuf b = {0};
    sb_reserve(&b, 128);
    if (!json_value(&b, v)) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* A string escape at p (just after the backslash) that cJSON prints back
 * the same way: the end of the escape, or NULL. */
static const char *canonical_escape(const char *p)
{
    if (strchr("\"\\bfnrt", *p) && *p)
        return p + 1;
    /* \u00xx, lowercase, only for control characters without a short form */
    if (p[0] == 'u' && p[1] == '0' && p[2] == '0' && (p[3] == '0' || p[3] == '1') &&
        ((p[4] >= '0' && p[4] <= '9') || (p[4] >= 'a' && p[4] <= 'f'))) {
        int c = (p[3] - '0') * 16 + (p[4] <= '9' ? p[4] - '0' : p[4] - 'a' + 10);
        if (c != '\b' && c != '\f' && c != '\n' && c != '\r' && c != '\t')
            return p + 5;
    }
    return NULL;
}

/* End of the JSON value starting at p if it is exactly what cJSON prints
 * for itself unformatted (no whitespace, integers of at most 15 digits, no
 * escapes cJSON would print differently), or NULL. (cJSON prints an
 * integer beyond int with "%1.15g": up to 15 digits, all exact in a double,
 * that is the integer itself; a 16th digit turns into an exponent.) NULL sends the caller
 * to the exact cJSON path, so this may be stricter than needed, never looser. */
static const char *skip_value(const char *p, int depth)
{
    if (depth > 1000)
        return NULL;
    switch (*p) {
    case '"':
        for (p++; *p != '"';) {
            if (!*p || (unsigned char)*p < 32)
                return NULL;
            if (*p == '\\') {
                if (!(p = canonical_escape(p + 1)))
                    return NULL;
            } else {
                p++;
            }
        }
        return p + 1;
    case '{':
    case '[': {
        char close = *p == '{' ? '}' : ']';
        p++;
        if (*p == close)
            return p + 1;
        for (;;) {
            if (close == '}') {
                if (*p != '"' || !(p = skip_value(p, depth + 1)) || *p++ != ':')
                    return NULL;
            }
            if (!(p = skip_value(p, depth + 1)))
                return NULL;
            if (*p == close)
                return p + 1;
            if (*p++ != ',')
                return NULL;
        }
    }
    default:
        if (*p == '-' || (*p >= '0' && *p <= '9')) {
            const char *d = *p == '-' ? p + 1 : p;
            const char *e = d;
            while (*e >= '0' && *e <= '9')
                e++;
            if (e == d || e - d > 15 || (*d == '0' && (e - d > 1 || d != p)))
                return NULL; /* empty, too long for "%1.15g", leading zero or -0 */
            if (*e == '.' || *e == 'e' || *e == 'E')
                return NULL;
            return e;
        }
        if (strncmp(p, "true", 4) == 0)
            return p + 4;
        if (strncmp(p, "null", 4) == 0)
            return p + 4;
        if (strncmp(p, "false", 5) == 0)
            return p + 5;
        return NULL;
    }
}

void jd_sb_json(struct jd_sbuf *b, const char *text, const char *otherwise)
{
    const char *end = text ? skip_value(text, 0) : NULL;
    if (end && *end == '\0') {
        jd_sb_puts(b, text); /* already exactly what cJSON would print */
        return;
    }
    cJSON *v = text ? cJSON_Parse(text) : NULL;
    char *t = v ? cJSON_PrintUnformatted(v) : NULL;
    jd_sb_puts(b, t ? t : otherwise);
    free(t);
    cJSON_Delete(v);
}

/* In a compact JSON object text: the first top-level "labels" member's
 * value as [*start, *end). 1 found, 0 absent, -1 not compact JSON. */
static int find_labels(const char *text, const char **start, const char **end)
{
    const char *p = text;
    if (*p != '{')
        return -1;
    p++;
    if (*p == '}')
        return p[1] ? -1 : 0;
    int found = 0;
    for (;;) {
        const char *k = p;
        if (*p != '"' || !(p = skip_value(p, 1)) || *p++ != ':')
            return -1;
        const char *v = p;
        if (!(p = skip_value(p, 1)))
            return -1;
        if (!found && p - v > 0 && strncmp(k, "\"labels\":", 9) == 0 && v == k + 9) {
            *start = v;
            *end = p;
            found = 1;
        }
        if (*p == '}')
            return p[1] ? -1 : found;
        if (*p++ != ',')
            return -1;
    }
}

char *jd_render_job_json(const struct jd_job *row)
{
    const char *ls = NULL, *le = NULL;
    int lab = row->definition ? find_labels(row->definition, &ls, &le) : -1;
    if (lab < 0) {
        /* Not in the form cJSON prints: the exact, slower path. */
        cJSON *o = jd_render_job(row);
        char *t = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        return t;
    }
    struct jd_sbuf b = {0};
    /* one allocation for the usual job: the fixed members take ~330 bytes,
     * jd_sb_string reserves 6x a string's length while it escapes */
    sb_reserve(&b, 512 + strlen(row->definition) + (row->output ? strlen(row->output) : 0) +
                       (row->error ? strlen(row->error) : 0));
    /* the id as a JSON string of its decimal digits, without printf */
    char id[24], *e = id + sizeof id, *p = e;
    *--p = '"';
    uint64_t u = row->id < 0 ? (uint64_t)0 - (uint64_t)row->id : (uint64_t)row->id;
    do
        *--p = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    if (row->id < 0)
        *--p = '-';
    *--p = '"';
    jd_sb_puts(&b, "{\"id\":");
    jd_sb_put(&b, p, (size_t)(e - p));
    jd_sb_puts(&b, ",\"state\":");
    jd_sb_string(&b, jd_job_state_name(row->state));
    jd_sb_puts(&b, ",\"queue\":");
    jd_sb_string(&b, row->queue ? row->queue : "default");
    jd_sb_puts(&b, ",\"priority\":");
    jd_sb_number(&b, row->priority);
    jd_sb_puts(&b, ",\"version\":");
    jd_sb_number(&b, row->version);
    jd_sb_puts(&b, ",\"attempts\":");
    jd_sb_number(&b, row->attempts);
    jd_sb_puts(&b, ",\"output\":");
    jd_sb_json(&b, row->output, "null");
    jd_sb_puts(&b, ",\"error\":");
    jd_sb_json(&b, row->error, "null");
    jd_sb_puts(&b, ",\"labels\":");
    if (lab == 1)
        jd_sb_put(&b, ls, (size_t)(le - ls));
    else
        jd_sb_puts(&b, "{}");
    sb_time(&b, ",\"created_at\":", row->created_ms);
    sb_time(&b, ",\"updated_at\":", row->updated_ms);
    sb_time(&b, ",\"started_at\":", row->started_ms);
    sb_time(&b, ",\"finished_at\":", row->finished_ms);
    sb_time(&b, ",\"run_at\":", row->run_at_ms);
    jd_sb_puts(&b, ",\"definition\":");
    jd_sb_puts(&b, row->definition);
    if (row->schedule_id) {
        jd_sb_puts(&b, ",\"schedule\":{\"id\":");
        jd_sb_string(&b, row->schedule_id);
        sb_time(&b, ",\"fire_time\":", schedule_fire_ms(row));
        jd_sb_puts(&b, "}");
    }
    jd_sb_puts(&b, "}");
    return b.p;
}

cJSON *jd_render_event(const struct jd_job_event *ev)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "seq", (double)ev->seq);
    jd_render_add_time(o, "time", ev->time_ms);
    cJSON_AddStringToObject(o, "kind", jd_event_kind_name(ev->kind));
    cJSON_AddNumberToObject(o, "tag", ev->tag);
    add_json(o, "data", ev->data);
    return o;
}

cJSON *jd_render_handlers(const struct jd_registry *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "plugins");
    const struct jd_plugin *p;
    for (size_t i = 0; (p = jd_registry_plugin(r, i)) != NULL; i++) {
        cJSON *po = cJSON_CreateObject();
        cJSON_AddStringToObject(po, "name", p->name ? p->name : "");
        cJSON_AddStringToObject(po, "version", p->version ? p->version : "");
        cJSON *cmds = cJSON_AddArrayToObject(po, "commands");
        for (size_t c = 0; c < p->ncommands; c++) {
            cJSON *co = cJSON_CreateObject();
            cJSON_AddStringToObject(co, "name", p->commands[c].name);
            cJSON_AddBoolToObject(co, "blocking", !!(p->commands[c].flags & JD_CMD_BLOCKING));
            cJSON_AddItemToArray(cmds, co);
        }
        cJSON *pts = cJSON_AddArrayToObject(po, "process_types");
        for (size_t t = 0; t < p->nprocess_types; t++) {
            cJSON *to = cJSON_CreateObject();
            cJSON_AddStringToObject(to, "name", p->process_types[t].name);
            cJSON *ms = cJSON_AddArrayToObject(to, "methods");
            for (const char *const *m = p->process_types[t].methods; m && *m; m++)
                cJSON_AddItemToArray(ms, cJSON_CreateString(*m));
            cJSON_AddItemToArray(pts, to);
        }
        cJSON_AddItemToArray(arr, po);
    }
    return o;
}

cJSON *jd_render_queues(const struct jd_queue_counts *rows, size_t n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "queues");
    for (size_t i = 0; i < n; i++) {
        cJSON *q = cJSON_CreateObject();
        cJSON_AddStringToObject(q, "name", rows[i].queue);
        cJSON_AddBoolToObject(q, "paused", rows[i].paused);
        cJSON *c = cJSON_AddObjectToObject(q, "counts");
        for (int s = 0; s < JD_JOB_NSTATES; s++)
            cJSON_AddNumberToObject(c, jd_job_state_name((enum jd_job_state)s),
                                    (double)rows[i].counts[s]);
        cJSON_AddItemToArray(arr, q);
    }
    return o;
}
