/*
 * Opening and closing the store, and every read.
 *
 * Open: check the directory, take the exclusive advisory lock
 * "<db>.lock" (flock, so a second Jackdaw on the same file is refused with
 * the holder's pid), check the file header, open the write connection in WAL
 * mode, migrate, seed the id counter, start the writer (writer.c).
 *
 * Reads run on read-only connections from a small pool: a reading thread
 * takes an idle connection (or opens one), runs its prepared statements and
 * gives it back. A connection is used by one thread at a time; WAL lets
 * readers run while the writer commits.
 *
 * Threading: jd_store_open/close on one thread (close after every reader and
 * producer is done; never from a done() callback). Reads, jd_store_next_id
 * and jd_store_stats from any thread.
 */
#include "storage/store_impl.h"
#include "storage/pg.h"

#include "common/alloc.h"
#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define JD_WRITER_CACHE_KIB 32768 /* 32 MiB page cache: the hot end of jobs and events */
#define JD_BUSY_TIMEOUT_MS 5000   /* readers may briefly wait on a WAL restart */

/* ---- names ---- */

static const char *const state_names[JD_JOB_NSTATES] = {
    "queued", "running", "waiting", "succeeded", "failed", "cancelled",
};

const char *jd_job_state_name(enum jd_job_state s)
{
    return (unsigned)s < JD_JOB_NSTATES ? state_names[s] : "unknown";
}

int jd_job_state_parse(const char *name)
{
    for (int i = 0; name && i < JD_JOB_NSTATES; i++)
        if (strcmp(name, state_names[i]) == 0)
            return i;
    return -1;
}

const char *jd_event_kind_name(enum jd_event_kind k)
{
    static const char *const names[] = {"state",   "dispatch", "complete",
                                        "message", "cancel",   "progress"};
    return (unsigned)k <= JD_EVK_PROGRESS ? names[k] : "unknown";
}

void jd_job_clear(struct jd_job *j)
{
    if (!j)
        return;
    free(j->queue);
    free(j->definition);
    free(j->output);
    free(j->error);
    free(j->idempotency_key);
    free(j->schedule_id);
    free(j->handler);
    memset(j, 0, sizeof *j);
}

void jd_schedule_row_clear(struct jd_schedule_row *r)
{
    if (!r)
        return;
    free(r->id);
    free(r->definition);
    free(r->last_outcome);
    memset(r, 0, sizeof *r);
}

void jd_schedule_rows_free(struct jd_schedule_row *rows, size_t n)
{
    for (size_t i = 0; rows && i < n; i++)
        jd_schedule_row_clear(&rows[i]);
    free(rows);
}

void jd_schedule_events_free(struct jd_schedule_event *ev, size_t n)
{
    for (size_t i = 0; ev && i < n; i++) {
        free(ev[i].kind);
        free(ev[i].data);
    }
    free(ev);
}

void jd_jobs_free(struct jd_job *rows, size_t n)
{
    for (size_t i = 0; rows && i < n; i++)
        jd_job_clear(&rows[i]);
    free(rows);
}

void jd_job_events_free(struct jd_job_event *ev, size_t n)
{
    for (size_t i = 0; ev && i < n; i++)
        free(ev[i].data);
    free(ev);
}

const char *const jd_state_event_data[JD_JOB_NSTATES] = {
    "{\"state\":\"queued\"}",    "{\"state\":\"running\"}", "{\"state\":\"waiting\"}",
    "{\"state\":\"succeeded\"}", "{\"state\":\"failed\"}",  "{\"state\":\"cancelled\"}",
};

/* v in decimal and term at p + at (room for 21 bytes); the new length.
 * (snprintf's format parsing was most of an append's cost.) */
static size_t evpack_dec(char *p, size_t at, int64_t v, char term)
{
    char d[20];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        d[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        p[at++] = '-';
    while (n)
        p[at++] = d[--n];
    p[at++] = term;
    return at;
}

void jd_evpack_put(struct jd_evpack *b, int kind, int64_t tag, int64_t dt, const char *data)
{
    size_t dl = data ? strlen(data) : 0, chars = 0;
    for (size_t i = 0; i < dl; i++)
        chars += ((unsigned char)data[i] & 0xC0) != 0x80;
    if (b->len + dl + 88 > b->cap) {
        b->cap = 2 * (b->len + dl + 88);
        b->p = jd_xrealloc(b->p, b->cap);
    }
    b->len = evpack_dec(b->p, b->len, kind, ',');
    b->len = evpack_dec(b->p, b->len, tag, ',');
    b->len = evpack_dec(b->p, b->len, dt, ',');
    b->len = evpack_dec(b->p, b->len, data ? (int64_t)chars : -1, ':');
    if (dl)
        memcpy(b->p + b->len, data, dl);
    b->len += dl;
    b->p[b->len] = '\0';
    b->n++;
}

/* One decimal field of a packed event ending in term; false when malformed. */
static bool evpack_num(const char **p, const char *end, char term, int64_t *v)
{
    const char *q = *p;
    bool neg = q < end && *q == '-';
    if (neg)
        q++;
    if (q >= end || *q < '0' || *q > '9')
        return false;
    int64_t x = 0;
    while (q < end && *q >= '0' && *q <= '9' && x < INT64_MAX / 10 - 10)
        x = x * 10 + (*q++ - '0');
    if (q >= end || *q != term)
        return false;
    *v = neg ? -x : x;
    *p = q + 1;
    return true;
}

/* The next packed event of [*p, end): its fields, data (not terminated)
 * and its length in bytes (-1: NULL). false at the end or when malformed
 * (then *p < end). The length is written in characters (UTF-8 code
 * points), as PostgreSQL's char_length counts them whatever the database
 * encoding, so both writers and the SQL function jd_ev_any agree. */
bool jd_evpack_next(const char **p, const char *end, int64_t f[3], const char **data, int64_t *dl)
{
    const char *q = *p;
    int64_t chars;
    if (q >= end || !evpack_num(&q, end, ',', &f[0]) || !evpack_num(&q, end, ',', &f[1]) ||
        !evpack_num(&q, end, ',', &f[2]) || !evpack_num(&q, end, ':', &chars) || chars < -1 ||
        chars > end - q)
        return false;
    const char *d = q;
    for (int64_t i = 0; i < chars; i++) {
        if (q >= end)
            return false;
        q++;
        while (q < end && ((unsigned char)*q & 0xC0) == 0x80)
            q++;
    }
    *data = d;
    *dl = chars < 0 ? -1 : q - d;
    *p = q;
    return true;
}

unsigned jd_evpack_count(const char *more, size_t len)
{
    unsigned n = 1;
    const char *p = more, *end = more ? more + len : NULL, *d;
    int64_t f[3], dl;
    while (more && jd_evpack_next(&p, end, f, &d, &dl))
        n++;
    return n;
}

int jd_evpack_expand(struct jd_job_event *first, const char *more, size_t len, int64_t after_seq,
                     struct jd_job_event **ev, size_t *n, size_t *cap)
{
    /* check the whole text first: a malformed row adds nothing */
    const char *p = more, *end = more ? more + len : NULL, *d;
    int64_t f[3], dl;
    while (more && jd_evpack_next(&p, end, f, &d, &dl))
        ;
    if (more && p != end) {
        free(first->data);
        first->data = NULL;
        return JD_EIO;
    }
    unsigned total = 1;
    for (p = more; more && jd_evpack_next(&p, end, f, &d, &dl);)
        total++;
    if (*n + total > *cap) {
        *cap = 2 * (*n + total);
        *ev = jd_xrealloc(*ev, *cap * sizeof **ev);
    }
    if (first->seq > after_seq)
        (*ev)[(*n)++] = *first;
    else
        free(first->data);
    p = more;
    for (int64_t i = 1; more && jd_evpack_next(&p, end, f, &d, &dl); i++) {
        if (first->seq + i <= after_seq)
            continue;
        struct jd_job_event *e = &(*ev)[(*n)++];
        e->job_id = first->job_id;
        e->seq = first->seq + i;
        e->time_ms = first->time_ms + f[2];
        e->kind = (enum jd_event_kind)f[0];
        e->tag = (uint32_t)f[1];
        e->data = dl < 0 ? NULL : jd_xstrndup(d, (size_t)dl);
    }
    first->data = NULL;
    return 0;
}

size_t jd_evpack_drop_state(struct jd_job_event *ev, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].kind == JD_EVK_STATE)
            free(ev[i].data);
        else
            ev[k++] = ev[i];
    }
    return k;
}

/* Past one JSON value at p (a string, or anything up to the next ',' or
 * '}' at its own depth); NULL when the text ends first. */
static const char *json_skip(const char *p, const char *end)
{
    int depth = 0;
    bool str = false;
    for (; p < end; p++) {
        char ch = *p;
        if (str) {
            if (ch == '\\')
                p++;
            else if (ch == '"')
                str = false;
            if (!str && depth == 0)
                return p + 1;
            continue;
        }
        if (ch == '"')
            str = true;
        else if (ch == '{' || ch == '[')
            depth++;
        else if (ch == '}' || ch == ']') {
            if (depth == 0)
                return p;
            if (--depth == 0)
                return p + 1;
        } else if (ch == ',' && depth == 0)
            return p;
    }
    return NULL;
}

bool jd_json_member(const char *json, size_t len, const char *key, const char **val, size_t *vlen)
{
    const char *p = json, *end = json + len;
    size_t kl = strlen(key);
    while (p < end && *p != '{')
        p++;
    for (p++; p < end;) {
        while (p < end && (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r'))
            p++;
        if (p >= end || *p != '"')
            return false;
        const char *k = p + 1, *ke = json_skip(p, end);
        if (!ke)
            return false;
        bool hit = (size_t)(ke - 1 - k) == kl && memcmp(k, key, kl) == 0;
        p = ke;
        while (p < end && (*p == ' ' || *p == ':'))
            p++;
        const char *v = p, *ve = json_skip(p, end);
        if (!ve)
            return false;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\n'))
            ve--;
        if (hit) {
            *val = v;
            *vlen = (size_t)(ve - v);
            return true;
        }
        p = ve;
        while (p < end && *p != ',' && *p != '}')
            p++;
        if (p < end && *p == '}')
            return false;
    }
    return false;
}

/* jd_ev_any(more, kind, tag, min_attempt): whether an event packed in
 * more (store_impl.h) is of kind and tag and, unless min_attempt is NULL,
 * has a number "attempt" above it. RS_TASK_STATE asks it of the events a
 * row holds beyond its first (as PostgreSQL's function of the same name,
 * storage/pg_schema.c). */
static void ev_any_fn(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    const char *p = (const char *)sqlite3_value_text(argv[0]);
    if (!p) {
        sqlite3_result_int(ctx, 0);
        return;
    }
    const char *end = p + sqlite3_value_bytes(argv[0]), *d;
    int64_t f[3], dl, kind = sqlite3_value_int64(argv[1]), tag = sqlite3_value_int64(argv[2]);
    bool any_attempt = sqlite3_value_type(argv[3]) == SQLITE_NULL;
    double min_attempt = sqlite3_value_double(argv[3]);
    while (jd_evpack_next(&p, end, f, &d, &dl)) {
        if (f[0] != kind || f[1] != tag)
            continue;
        const char *v;
        size_t vl;
        if (any_attempt) {
            sqlite3_result_int(ctx, 1);
            return;
        }
        if (dl > 0 && jd_json_member(d, (size_t)dl, "attempt", &v, &vl) && vl > 0 &&
            (*v == '-' || (*v >= '0' && *v <= '9')) && strtod(v, NULL) > min_attempt) {
            sqlite3_result_int(ctx, 1);
            return;
        }
    }
    sqlite3_result_int(ctx, 0);
}

/* The SQL functions the read statements use (read_sql). */
static int read_functions(sqlite3 *db)
{
    return sqlite3_create_function_v2(db, "jd_ev_any", 4,
                                      SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_INNOCUOUS, NULL,
                                      ev_any_fn, NULL, NULL, NULL);
}

void jd_queue_counts_free(struct jd_queue_counts *rows, size_t n)
{
    for (size_t i = 0; rows && i < n; i++)
        free(rows[i].queue);
    free(rows);
}

void jd_strings_free(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

int jd_store_sqlite_rc(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_OK:
    case SQLITE_DONE:
    case SQLITE_ROW:
        return 0;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
        return JD_ECORRUPT;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return JD_EBUSY;
    case SQLITE_NOMEM:
        return JD_ENOMEM;
    case SQLITE_CONSTRAINT:
        return JD_EEXIST;
    default:
        return JD_EIO;
    }
}

/* ---- open / close ---- */

static int check_directory(const char *path, struct jd_error *err)
{
    char *copy = jd_xstrdup(path);
    const char *dir = dirname(copy);
    struct stat st;
    struct statvfs vfs;
    int rc = 0;
    if (stat(dir, &st) != 0)
        rc = jd_error_set(err, JD_EIO, NULL, "cannot open database %s: directory %s: %s", path, dir,
                          strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        rc = jd_error_set(err, JD_EIO, NULL, "cannot open database %s: %s is not a directory", path,
                          dir);
    else if (access(dir, W_OK) != 0)
        rc = jd_error_set(err, JD_EIO, NULL,
                          "cannot open database %s: directory %s is not writable (%s)", path, dir,
                          strerror(errno));
    else if (statvfs(dir, &vfs) == 0 && (vfs.f_flag & ST_RDONLY))
        rc = jd_error_set(err, JD_EIO, NULL,
                          "cannot open database %s: directory %s is on a read-only file system",
                          path, dir);
    free(copy);
    return rc;
}

#define LOCK_ORPHAN_WAITS 200        /* ... of LOCK_ORPHAN_WAIT_NS: 2 s at most */
#define LOCK_ORPHAN_WAIT_NS 10000000 /* 10 ms */

static int take_lock(struct jd_store *s, struct jd_error *err)
{
    s->lock_fd = open(s->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (s->lock_fd < 0)
        return jd_error_set(err, JD_EIO, NULL, "cannot open database lock %s: %s", s->lock_path,
                            strerror(errno));
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char holder[32] = "";
        ssize_t r = pread(s->lock_fd, holder, sizeof holder - 1, 0);
        holder[r > 0 ? r : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        /* The Jackdaw that wrote its pid is gone (killed), yet the lock is
         * held: by a child it was forking when it died, which drops the
         * descriptor (close-on-exec) as soon as it execs. Give it a moment
         * rather than refuse a restart. */
        long hp = strtol(holder, NULL, 10);
        for (int i = 0; e == EWOULDBLOCK && hp > 0 && i < LOCK_ORPHAN_WAITS; i++) {
            if (kill((pid_t)hp, 0) == 0 || errno != ESRCH)
                break; /* alive (or not ours to probe): a real second Jackdaw */
            struct timespec ts = {0, LOCK_ORPHAN_WAIT_NS};
            nanosleep(&ts, NULL);
            if (flock(s->lock_fd, LOCK_EX | LOCK_NB) == 0)
                goto locked;
            e = errno;
        }
        if (e == EWOULDBLOCK)
            return jd_error_set(err, JD_EBUSY, NULL,
                                "database %s is in use by another running Jackdaw (pid %s, "
                                "lock %s); refusing to open it twice",
                                s->path, holder[0] ? holder : "unknown", s->lock_path);
        return jd_error_set(err, JD_EIO, NULL, "cannot lock %s: %s", s->lock_path, strerror(e));
    }
locked:;
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(s->lock_fd, 0) != 0 || pwrite(s->lock_fd, pid, (size_t)len, 0) != len) {
        /* The lock is held; the pid is only a courtesy for the error above. */
    }
    return 0;
}

/* A non-empty file that does not start with SQLite's magic is foreign. */
static int check_header(const char *path, struct jd_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0
                               : jd_error_set(err, JD_EIO, NULL, "cannot open database %s: %s",
                                              path, strerror(errno));
    struct stat st;
    char magic[16];
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = jd_error_set(err, JD_EIO, NULL, "cannot open database %s: not a regular file", path);
    else if (st.st_size > 0 && (read(fd, magic, sizeof magic) != (ssize_t)sizeof magic ||
                                memcmp(magic, "SQLite format 3", 16) != 0))
        rc = jd_error_set(err, JD_ECORRUPT, NULL,
                          "database %s is not a SQLite database (corrupt or foreign file); "
                          "refusing to use it",
                          path);
    close(fd);
    return rc;
}

static int wexec(struct jd_store *s, const char *sql, struct jd_error *err)
{
    int rc = sqlite3_exec(s->wdb, sql, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        return 0;
    int code = jd_store_sqlite_rc(rc);
    if (code == JD_ECORRUPT)
        return jd_error_set(err, code, NULL, "database %s is corrupt or not a database (%s)",
                            s->path, sqlite3_errmsg(s->wdb));
    return jd_error_set(err, code ? code : JD_EIO, NULL, "database %s: %s: %s", s->path, sql,
                        sqlite3_errmsg(s->wdb));
}

static int configure_writer(struct jd_store *s, const struct jd_store_config *cfg,
                            struct jd_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->wdb, "PRAGMA journal_mode = WAL", -1, &st, NULL);
    const char *mode = NULL;
    if (rc == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        mode = (const char *)sqlite3_column_text(st, 0);
    bool wal = mode && strcmp(mode, "wal") == 0;
    if (!wal) {
        int code = jd_store_sqlite_rc(rc ? rc : sqlite3_errcode(s->wdb));
        rc = jd_error_set(err, code ? code : JD_EIO, NULL,
                          "database %s: cannot switch to WAL mode: %s", s->path,
                          sqlite3_errmsg(s->wdb));
        if (code == JD_ECORRUPT)
            rc = jd_error_set(err, JD_ECORRUPT, NULL,
                              "database %s is corrupt or not a database (%s)", s->path,
                              sqlite3_errmsg(s->wdb));
    } else {
        rc = 0;
    }
    sqlite3_finalize(st);
    if (rc)
        return rc;
    char sql[256];
    snprintf(sql, sizeof sql,
             "PRAGMA synchronous = %s; PRAGMA cache_size = -%d;"
             " PRAGMA foreign_keys = OFF;",
             cfg->sync_full ? "FULL" : "NORMAL", JD_WRITER_CACHE_KIB);
    if ((rc = wexec(s, sql, err)) != 0)
        return rc;
    if (cfg->max_bytes) {
        int page = 4096;
        sqlite3_stmt *ps = NULL;
        if (sqlite3_prepare_v2(s->wdb, "PRAGMA page_size", -1, &ps, NULL) == SQLITE_OK &&
            sqlite3_step(ps) == SQLITE_ROW)
            page = sqlite3_column_int(ps, 0);
        sqlite3_finalize(ps);
        unsigned long long pages = cfg->max_bytes / (unsigned)(page > 0 ? page : 4096);
        snprintf(sql, sizeof sql, "PRAGMA max_page_count = %llu", pages ? pages : 1);
        if ((rc = wexec(s, sql, err)) != 0)
            return rc;
    }
    return 0;
}

static int seed_next_id(struct jd_store *s, struct jd_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc =
        sqlite3_prepare_v2(s->wdb,
                           "SELECT max(coalesce((SELECT max(id) FROM jobs), 0),"
                           " coalesce((SELECT value FROM meta WHERE key = 'max_deleted_id'), 0))",
                           -1, &st, NULL);
    int64_t max = 0;
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        max = sqlite3_column_int64(st, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK)
        return jd_error_set(err, jd_store_sqlite_rc(rc), NULL, "database %s: reading ids: %s",
                            s->path, sqlite3_errmsg(s->wdb));
    atomic_init(&s->next_id, max + 1);
    /* the same for event ids (GET /v1/events resumes by them) */
    st = NULL;
    rc = sqlite3_prepare_v2(s->wdb,
                            "SELECT coalesce((SELECT value FROM meta"
                            " WHERE key = 'max_deleted_event_id'), 0), id, more"
                            " FROM (SELECT 1) LEFT JOIN (SELECT id, more FROM events"
                            " ORDER BY id DESC LIMIT 1)",
                            -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        /* the newest row's last id: a packed row holds id .. id + n - 1 */
        int64_t last = sqlite3_column_int64(st, 1) +
                       jd_evpack_count((const char *)sqlite3_column_text(st, 2),
                                       (size_t)sqlite3_column_bytes(st, 2)) -
                       1;
        if (sqlite3_column_type(st, 1) == SQLITE_NULL)
            last = 0;
        s->event_max = sqlite3_column_int64(st, 0) > last ? sqlite3_column_int64(st, 0) : last;
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK)
        return jd_error_set(err, jd_store_sqlite_rc(rc), NULL, "database %s: reading ids: %s",
                            s->path, sqlite3_errmsg(s->wdb));
    return 0;
}

static void store_free(struct jd_store *s);

/* meta 'open' is 1 while a process has the database open and 0 once it
 * closed it: found at 1, the last process died without closing. Set here,
 * before the writer starts; cleared by store_free after it stopped. */
static int mark_open(struct jd_store *s, struct jd_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->wdb, "SELECT value FROM meta WHERE key = 'open'", -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW)
        s->unclean = sqlite3_column_int64(st, 0) != 0;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return jd_error_set(err, jd_store_sqlite_rc(rc), NULL, "database %s: reading meta: %s",
                            s->path, sqlite3_errmsg(s->wdb));
    /* Not fatal: a database at --max-db-size must still open (and drain). */
    s->marked_open = sqlite3_exec(s->wdb,
                                  "INSERT INTO meta(key, value) VALUES ('open', 1)"
                                  " ON CONFLICT(key) DO UPDATE SET value = 1",
                                  NULL, NULL, NULL) == SQLITE_OK;
    if (!s->marked_open)
        jd_log(JD_LOG_WARN, "storage: marking the database open failed", "db", s->path, "error",
               sqlite3_errmsg(s->wdb), NULL);
    return 0;
}

char *jd_store_display_path(const char *path)
{
    return jd_store_path_is_pg(path) ? jd_pg_display_url(path) : jd_xstrdup(path);
}

bool jd_store_unclean(const struct jd_store *s)
{
    return s->unclean;
}

/* Process-wide SQLite settings, before SQLite initialises (if something
 * else initialised it first they are skipped, which costs only speed): no
 * memory statistics (they take a global mutex on every malloc and free),
 * SQLite's small allocations from per-thread caches (sqlite_mem.c),
 * and savepoint journals kept in one memory chunk of up to
 * JD_STMT_JOURNAL_SPILL before they spill to a temporary file (the default
 * 64 KiB spills for large submit_many groups; temp_store=MEMORY instead
 * journals in 1 KiB chunks and measured ~12% more writer CPU per record). */
#define JD_STMT_JOURNAL_SPILL (1 << 20)
static void sqlite_global_init(void)
{
    jd_sqlite_mem_install();
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    sqlite3_config(SQLITE_CONFIG_STMTJRNL_SPILL, JD_STMT_JOURNAL_SPILL);
}

int jd_store_open(const struct jd_store_config *cfg, struct jd_store **out, struct jd_error *err)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, sqlite_global_init);
    *out = NULL;
    if (!cfg || !cfg->path || !cfg->path[0])
        return jd_error_set(err, JD_EINVAL, NULL, "no database path given");
    struct jd_store *s = jd_xcalloc(1, sizeof *s);
    s->path = jd_xstrdup(cfg->path);
    s->lock_path = jd_xasprintf("%s.lock", cfg->path);
    s->lock_fd = -1;
    s->sync_full = cfg->sync_full;
    s->retention_ms = cfg->retention_ms;
    s->max_batch = cfg->max_batch ? cfg->max_batch : 1024;
    atomic_init(&s->head, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->pool_mu, NULL);
    pthread_mutex_init(&s->ckpt_mu, NULL);
    pthread_cond_init(&s->ckpt_cv, NULL);

    if (jd_store_path_is_pg(cfg->path)) {
        /* PostgreSQL (storage/pg.h): no lock file, no SQLite connection. */
        int prc = jd_pg_open(s, cfg, err);
        if (prc) {
            store_free(s);
            return prc;
        }
        *out = s;
        return 0;
    }

    int rc = check_directory(s->path, err);
    if (rc == 0)
        rc = take_lock(s, err);
    if (rc == 0)
        rc = check_header(s->path, err);
    if (rc)
        goto fail;

    int src = sqlite3_open_v2(
        s->path, &s->wdb, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (src != SQLITE_OK) {
        rc = jd_error_set(err, jd_store_sqlite_rc(src) ? jd_store_sqlite_rc(src) : JD_EIO, NULL,
                          "cannot open database %s: %s", s->path,
                          s->wdb ? sqlite3_errmsg(s->wdb) : sqlite3_errstr(src));
        goto fail;
    }
    sqlite3_extended_result_codes(s->wdb, 1);
    sqlite3_busy_timeout(s->wdb, JD_BUSY_TIMEOUT_MS);
    if ((rc = configure_writer(s, cfg, err)) != 0)
        goto fail;
    if ((rc = jd_schema_migrate(s->wdb, s->path, err)) != 0)
        goto fail;
    if ((rc = seed_next_id(s, err)) != 0)
        goto fail;
    if ((rc = mark_open(s, err)) != 0)
        goto fail;
    if ((rc = jd_checkpointer_start(s, err)) != 0)
        goto fail;
    if ((rc = jd_writer_start(s, err)) != 0)
        goto fail;
    *out = s;
    return 0;

fail:
    store_free(s);
    return rc;
}

#define JD_RS_MAX 32 /* read statements per connection (RS_N, checked below) */

struct jd_rconn {
    sqlite3 *db;
    sqlite3_stmt *st[JD_RS_MAX];
    struct jd_rconn *next;
};

static void store_free(struct jd_store *s)
{
    if (s->pg)
        jd_pg_cluster_stop(s); /* no hook is called once close returns */
    jd_writer_stop(s);
    jd_checkpointer_stop(s);
    if (s->pg)
        jd_pg_close(s); /* after the writer: it drained onto the database */
    if (s->marked_open && sqlite3_exec(s->wdb, "UPDATE meta SET value = 0 WHERE key = 'open'", NULL,
                                       NULL, NULL) != SQLITE_OK)
        jd_log(JD_LOG_WARN, "storage: marking the database closed failed", "db", s->path, "error",
               sqlite3_errmsg(s->wdb), NULL);
    while (s->pool) {
        struct jd_rconn *c = s->pool;
        s->pool = c->next;
        for (size_t i = 0; i < sizeof c->st / sizeof c->st[0]; i++)
            sqlite3_finalize(c->st[i]);
        sqlite3_close(c->db);
        free(c);
    }
    if (s->wdb)
        sqlite3_close(s->wdb);
    if (s->lock_fd >= 0)
        close(s->lock_fd); /* releases the flock; the file stays (unlinking would race) */
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->pool_mu);
    pthread_mutex_destroy(&s->ckpt_mu);
    pthread_cond_destroy(&s->ckpt_cv);
    free(s->path);
    free(s->lock_path);
    free(s);
}

void jd_store_close(struct jd_store *s)
{
    if (s)
        store_free(s);
}

int64_t jd_store_next_id(struct jd_store *s)
{
    if (s->pg)
        return jd_pg_next_id(s);
    /* relaxed: only uniqueness matters, which the RMW gives. */
    return atomic_fetch_add_explicit(&s->next_id, 1, memory_order_relaxed);
}

void jd_store_stats(struct jd_store *s, struct jd_store_stats *out)
{
    memset(out, 0, sizeof *out);
    /* relaxed: independent counters; a scrape may see them mid-update. */
    out->commits = atomic_load_explicit(&s->st_commits, memory_order_relaxed);
    out->records = atomic_load_explicit(&s->st_records, memory_order_relaxed);
    out->failed_commits = atomic_load_explicit(&s->st_failed_commits, memory_order_relaxed);
    out->retention_deleted = atomic_load_explicit(&s->st_retention_deleted, memory_order_relaxed);
    uint64_t enq = atomic_load_explicit(&s->st_enqueued, memory_order_relaxed);
    uint64_t fin = atomic_load_explicit(&s->st_finished, memory_order_relaxed);
    out->queue_depth = enq > fin ? enq - fin : 0;
    for (int i = 0; i < 8; i++)
        out->batch_hist[i] = atomic_load_explicit(&s->st_batch_hist[i], memory_order_relaxed);
    for (int i = 0; i < 10; i++)
        out->commit_us_hist[i] =
            atomic_load_explicit(&s->st_commit_us_hist[i], memory_order_relaxed);
    out->commit_us_sum = atomic_load_explicit(&s->st_commit_us_sum, memory_order_relaxed);
    out->checkpoints = atomic_load_explicit(&s->st_checkpoints, memory_order_relaxed);
}

/* ---- reads ---- */

/* Jobs are read joined with their definitions (one primary-key lookup per
 * row, see schema.c for why they are apart). CROSS JOIN keeps jobs as the
 * outer loop, so the jobs index gives the order and no sort is needed. */
#define JOB_COLS                                                                                   \
    "j.id, j.queue, j.priority, j.state, d.definition, j.run_at_ms, j.attempts, j.version,"        \
    " j.output, j.error, j.created_ms, j.updated_ms, j.started_ms, j.finished_ms,"                 \
    " j.idempotency_key, j.schedule_id, j.crashes"
#define JOB_FROM " FROM jobs j CROSS JOIN job_definitions d ON d.job_id = j.id"
#define EVENT_COLS "job_id, seq, time_ms, kind, tag, data, more"

enum {
    RS_JOB_GET,
    RS_LIST_ALL,
    RS_LIST_STATE,
    RS_LIST_QUEUE,
    RS_LIST_QUEUE_STATE,
    RS_EVENTS,
    RS_COUNTS,
    RS_QUEUES,
    RS_IDEM,
    RS_QUEUED_ALL,
    RS_RECOVER_EVENTS,
    RS_PAUSED,
    RS_LIST_SCHEDULE,
    RS_LIST_SCHEDULE_STATE,
    RS_SCHED_GET,
    RS_SCHED_LIST,
    RS_SCHED_EVENTS,
    RS_OLDEST_QUEUED,
    RS_QCONFIG,
    RS_UNIQUE_KEYS,
    RS_RCMD_LIST,
    RS_TASK_STATE,
    RS_TASK_CLAIMED,
    RS_QUEUED_SAME,
    RS_QUEUED_LOWER,
    RS_QUEUED_LATER,
    RS_RUNNING,
    RS_WAITING,
    RS_BEGIN,
    RS_COMMIT,
    RS_N
};
_Static_assert(RS_N <= JD_RS_MAX, "struct jd_rconn holds JD_RS_MAX statements");

#define SCHED_COLS                                                                                 \
    "id, definition, paused, retired, next_fire_ms, last_fire_ms, last_job_id, last_outcome,"      \
    " fires, skips, event_seq, created_ms, updated_ms, anchor_ms"

/* Every read the store makes; tests check each plan with EXPLAIN QUERY PLAN. */
static const char *const read_sql[RS_N] = {
    [RS_JOB_GET] = "SELECT " JOB_COLS JOB_FROM " WHERE j.id = ?1",
    [RS_LIST_ALL] = "SELECT " JOB_COLS JOB_FROM " WHERE j.id < ?1 ORDER BY j.id DESC LIMIT ?2",
    [RS_LIST_STATE] = "SELECT " JOB_COLS JOB_FROM " WHERE j.state = ?3 AND j.id < ?1"
                      " ORDER BY j.id DESC LIMIT ?2",
    [RS_LIST_QUEUE] = "SELECT " JOB_COLS " FROM jobs j INDEXED BY jobs_queue"
                      " CROSS JOIN job_definitions d ON d.job_id = j.id"
                      " WHERE j.queue = ?4 AND j.id < ?1 ORDER BY j.id DESC LIMIT ?2",
    [RS_LIST_QUEUE_STATE] = "SELECT " JOB_COLS " FROM jobs j INDEXED BY jobs_queue_state"
                            " CROSS JOIN job_definitions d ON d.job_id = j.id"
                            " WHERE j.queue = ?4 AND j.state = ?3 AND j.id < ?1"
                            " ORDER BY j.id DESC LIMIT ?2",
    /* a row holds up to JD_EV_RUN_MAX events: the one that holds ?2 + 1
     * starts at most 7 before it, and up to 7 rows before it may hold
     * none after ?2 */
    [RS_EVENTS] = "SELECT " EVENT_COLS " FROM events WHERE job_id = ?1 AND seq > ?2 - 7"
                  " ORDER BY seq LIMIT ?3 + 7",
    [RS_COUNTS] = "SELECT queue, state, n FROM queue_counts WHERE n > 0 ORDER BY queue, state",
    [RS_QUEUES] = "SELECT name, paused FROM queues ORDER BY name",
    [RS_IDEM] = "SELECT job_id, fingerprint FROM idempotency WHERE key = ?1",
    /* Queued jobs, all queues, in id order (recovery without the window,
     * merged with RS_RUNNING and RS_WAITING by id). */
    [RS_QUEUED_ALL] = "SELECT " JOB_COLS " FROM jobs j INDEXED BY jobs_state"
                      " CROSS JOIN job_definitions d ON d.job_id = j.id WHERE j.state = 0"
                      " ORDER BY j.id",
    [RS_RECOVER_EVENTS] = "SELECT " EVENT_COLS " FROM events WHERE job_id = ?1"
                          " AND (kind > 0 OR more IS NOT NULL) ORDER BY seq",
    [RS_PAUSED] = "SELECT name FROM queues WHERE paused = 1 ORDER BY name",
    [RS_UNIQUE_KEYS] = "SELECT key, job_id, expires_ms FROM unique_keys",
    [RS_QCONFIG] = "SELECT name, config FROM queues WHERE config IS NOT NULL ORDER BY name",
    [RS_LIST_SCHEDULE] = "SELECT " JOB_COLS " FROM jobs j INDEXED BY jobs_schedule"
                         " CROSS JOIN job_definitions d ON d.job_id = j.id"
                         " WHERE j.schedule_id = ?5 AND j.id < ?1 ORDER BY j.id DESC LIMIT ?2",
    [RS_LIST_SCHEDULE_STATE] = "SELECT " JOB_COLS " FROM jobs j INDEXED BY jobs_schedule"
                               " CROSS JOIN job_definitions d ON d.job_id = j.id"
                               " WHERE j.schedule_id = ?5 AND j.state = ?3 AND j.id < ?1"
                               " ORDER BY j.id DESC LIMIT ?2",
    [RS_SCHED_GET] = "SELECT " SCHED_COLS " FROM schedules WHERE id = ?1",
    [RS_SCHED_LIST] = "SELECT " SCHED_COLS " FROM schedules WHERE id > ?1 ORDER BY id LIMIT ?2",
    [RS_SCHED_EVENTS] = "SELECT seq, time_ms, fire_ms, job_id, kind, data FROM schedule_events"
                        " WHERE schedule_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
    [RS_OLDEST_QUEUED] = "SELECT id, created_ms FROM jobs INDEXED BY jobs_queue_state"
                         " WHERE queue = ?1 AND state = 0 ORDER BY id LIMIT 1",
    [RS_RCMD_LIST] = "SELECT name, timeout_ms, description, created_ms, updated_ms,"
                     " max_in_flight FROM remote_commands ORDER BY name",
    /* A claimed row whose attempt's completion is in the job's history
     * (a complete event for its tag, no later attempt dispatched) reads as
     * completed: completing a task writes no row of its own, the job's
     * complete event is the record. */
    [RS_TASK_STATE] = "SELECT CASE WHEN t.state = 1 AND EXISTS (SELECT 1 FROM events e"
                      " WHERE e.job_id = t.job_id AND ((e.tag = t.tag AND e.kind = 2)"
                      " OR jd_ev_any(e.more, 2, t.tag, NULL)))"
                      " AND NOT EXISTS (SELECT 1 FROM events d WHERE d.job_id = t.job_id"
                      " AND ((d.tag = t.tag AND d.kind = 1"
                      " AND json_extract(d.data, '$.attempt') > t.attempt)"
                      " OR jd_ev_any(d.more, 1, t.tag, t.attempt)))"
                      " THEN 2 ELSE t.state END, t.job_id FROM tasks t WHERE t.id = ?1",
    [RS_TASK_CLAIMED] = "SELECT 1 FROM tasks WHERE job_id = ?1 AND tag = ?2 AND attempt = ?3",
    /* A page of a queue's queued jobs in run order after (?2 priority, ?3
     * id): the rest of ?2's priority, then the lower ones. Split in two
     * because one range over (priority DESC, id ASC) is not expressible as
     * a row value; each half is one range of jobs_queued, no sort. */
    [RS_QUEUED_SAME] = "SELECT " JOB_COLS " FROM jobs j INDEXED BY jobs_queued"
                       " CROSS JOIN job_definitions d ON d.job_id = j.id"
                       " WHERE j.queue = ?1 AND j.state = 0 AND j.priority = ?2 AND j.id > ?3"
                       " AND j.run_at_ms <= ?4 ORDER BY j.id LIMIT ?5",
    [RS_QUEUED_LOWER] = "SELECT " JOB_COLS " FROM jobs j INDEXED BY jobs_queued"
                        " CROSS JOIN job_definitions d ON d.job_id = j.id"
                        " WHERE j.queue = ?1 AND j.state = 0 AND j.priority < ?2"
                        " AND j.run_at_ms <= ?4 ORDER BY j.priority DESC, j.id LIMIT ?5",
    [RS_QUEUED_LATER] = "SELECT " JOB_COLS " FROM jobs j INDEXED BY jobs_queued_later"
                        " CROSS JOIN job_definitions d ON d.job_id = j.id"
                        " WHERE j.state = 0 AND j.run_at_ms > j.created_ms"
                        " AND (j.run_at_ms, j.id) > (?1, ?2) AND j.run_at_ms <= ?3"
                        " ORDER BY j.run_at_ms, j.id LIMIT ?4",
    /* Started jobs (recovery with the window): each state's range of
     * jobs_state is in id order; jd_store_recover_started merges the two. */
    [RS_RUNNING] = "SELECT " JOB_COLS " FROM jobs j INDEXED BY jobs_state"
                   " CROSS JOIN job_definitions d ON d.job_id = j.id WHERE j.state = 1"
                   " ORDER BY j.id",
    [RS_WAITING] = "SELECT " JOB_COLS " FROM jobs j INDEXED BY jobs_state"
                   " CROSS JOIN job_definitions d ON d.job_id = j.id WHERE j.state = 2"
                   " ORDER BY j.id",
    [RS_BEGIN] = "BEGIN",
    [RS_COMMIT] = "COMMIT",
};

static int rconn_get(struct jd_store *s, struct jd_rconn **out)
{
    pthread_mutex_lock(&s->pool_mu);
    struct jd_rconn *c = s->pool;
    if (c)
        s->pool = c->next;
    pthread_mutex_unlock(&s->pool_mu);
    if (c) {
        *out = c;
        return 0;
    }
    c = jd_xcalloc(1, sizeof *c);
    int rc = sqlite3_open_v2(s->path, &c->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_extended_result_codes(c->db, 1);
        sqlite3_busy_timeout(c->db, JD_BUSY_TIMEOUT_MS);
        rc = read_functions(c->db);
    }
    for (int i = 0; rc == SQLITE_OK && i < RS_N; i++)
        rc = sqlite3_prepare_v3(c->db, read_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &c->st[i], NULL);
    if (rc != SQLITE_OK) {
        for (int i = 0; i < RS_N; i++)
            sqlite3_finalize(c->st[i]);
        sqlite3_close(c->db);
        free(c);
        return jd_store_sqlite_rc(rc) ? jd_store_sqlite_rc(rc) : JD_EIO;
    }
    *out = c;
    return 0;
}

static void rconn_put(struct jd_store *s, struct jd_rconn *c)
{
    pthread_mutex_lock(&s->pool_mu);
    c->next = s->pool;
    s->pool = c;
    pthread_mutex_unlock(&s->pool_mu);
}

/* For storage/find.c (store_impl.h). */
int jd_rconn_get(struct jd_store *s, struct jd_rconn **out)
{
    return rconn_get(s, out);
}

void jd_rconn_put(struct jd_store *s, struct jd_rconn *c)
{
    rconn_put(s, c);
}

sqlite3 *jd_rconn_db(struct jd_rconn *c)
{
    return c->db;
}

static void row_to_job(sqlite3_stmt *st, struct jd_job *j);
static int step_rc(int rc);

int jd_rconn_job_get(struct jd_rconn *c, int64_t id, struct jd_job *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st = c->st[RS_JOB_GET];
    sqlite3_bind_int64(st, 1, id);
    int src = sqlite3_step(st);
    if (src == SQLITE_ROW)
        row_to_job(st, out);
    int rc = src == SQLITE_ROW ? 0 : src == SQLITE_DONE ? JD_ENOENT : step_rc(src);
    sqlite3_reset(st);
    return rc;
}

int jd_rconn_tx(struct jd_rconn *c, bool begin)
{
    sqlite3_stmt *st = c->st[begin ? RS_BEGIN : RS_COMMIT];
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? 0 : JD_EIO;
}

static char *col_text(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? jd_xstrdup((const char *)t) : NULL;
}

static void row_to_job(sqlite3_stmt *st, struct jd_job *j)
{
    j->id = sqlite3_column_int64(st, 0);
    j->queue = col_text(st, 1);
    j->priority = sqlite3_column_int64(st, 2);
    j->state = (enum jd_job_state)sqlite3_column_int(st, 3);
    j->definition = col_text(st, 4);
    j->run_at_ms = sqlite3_column_int64(st, 5);
    j->attempts = (uint32_t)sqlite3_column_int64(st, 6);
    j->version = sqlite3_column_int64(st, 7);
    j->output = col_text(st, 8);
    j->error = col_text(st, 9);
    j->created_ms = sqlite3_column_int64(st, 10);
    j->updated_ms = sqlite3_column_int64(st, 11);
    j->started_ms = sqlite3_column_int64(st, 12);
    j->finished_ms = sqlite3_column_int64(st, 13);
    j->idempotency_key = col_text(st, 14);
    j->schedule_id = col_text(st, 15);
    j->crashes = (uint32_t)sqlite3_column_int64(st, 16);
    j->handler = NULL; /* written with the row, not read back (see struct jd_job) */
}

static void row_to_event(sqlite3_stmt *st, struct jd_job_event *e)
{
    e->job_id = sqlite3_column_int64(st, 0);
    e->seq = sqlite3_column_int64(st, 1);
    e->time_ms = sqlite3_column_int64(st, 2);
    e->kind = (enum jd_event_kind)sqlite3_column_int(st, 3);
    e->tag = (uint32_t)sqlite3_column_int64(st, 4);
    e->data = col_text(st, 5);
}

/* Result of a finished step loop: SQLITE_DONE -> 0. */
static int step_rc(int rc)
{
    return rc == SQLITE_DONE ? 0 : (jd_store_sqlite_rc(rc) ? jd_store_sqlite_rc(rc) : JD_EIO);
}

int jd_store_job_get(struct jd_store *s, int64_t id, struct jd_job *out)
{
    if (s->pg)
        return jd_pg_job_get(s, id, out);
    memset(out, 0, sizeof *out);
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    sqlite3_stmt *st = c->st[RS_JOB_GET];
    sqlite3_bind_int64(st, 1, id);
    int src = sqlite3_step(st);
    if (src == SQLITE_ROW)
        row_to_job(st, out);
    rc = src == SQLITE_ROW ? 0 : src == SQLITE_DONE ? JD_ENOENT : step_rc(src);
    sqlite3_reset(st);
    rconn_put(s, c);
    return rc;
}

int jd_store_job_list(struct jd_store *s, const struct jd_job_filter *f, struct jd_job **rows,
                      size_t *n, int64_t *next_cursor)
{
    if (s->pg)
        return jd_pg_job_list(s, f, rows, n, next_cursor);
    *rows = NULL;
    *n = 0;
    *next_cursor = 0;
    if (!f || f->limit < 1 || f->limit > 1000 || f->state < -1 || f->state >= JD_JOB_NSTATES ||
        f->before_id < 0)
        return JD_EINVAL;
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    int which = f->schedule ? (f->state >= 0 ? RS_LIST_SCHEDULE_STATE : RS_LIST_SCHEDULE)
                : f->queue  ? (f->state >= 0 ? RS_LIST_QUEUE_STATE : RS_LIST_QUEUE)
                            : (f->state >= 0 ? RS_LIST_STATE : RS_LIST_ALL);
    sqlite3_stmt *st = c->st[which];
    sqlite3_bind_int64(st, 1, f->before_id > 0 ? f->before_id : INT64_MAX);
    sqlite3_bind_int64(st, 2, (int64_t)f->limit + 1); /* one extra: is there a next page? */
    if (f->state >= 0)
        sqlite3_bind_int(st, 3, f->state);
    if (f->queue)
        sqlite3_bind_text(st, 4, f->queue, -1, SQLITE_STATIC);
    if (f->schedule)
        sqlite3_bind_text(st, 5, f->schedule, -1, SQLITE_STATIC);
    struct jd_job *out = jd_xcalloc(f->limit + 1, sizeof *out);
    size_t k = 0;
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW)
        row_to_job(st, &out[k++]);
    rc = step_rc(src);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    rconn_put(s, c);
    if (rc) {
        jd_jobs_free(out, k);
        return rc;
    }
    if (k > f->limit) {
        jd_job_clear(&out[--k]);
        *next_cursor = out[k - 1].id;
    }
    *rows = out;
    *n = k;
    return 0;
}

int jd_store_events(struct jd_store *s, int64_t job_id, int64_t after_seq, unsigned limit,
                    struct jd_job_event **events, size_t *n)
{
    if (s->pg)
        return jd_pg_events(s, job_id, after_seq, limit, events, n);
    *events = NULL;
    *n = 0;
    if (limit < 1 || limit > 10000)
        return JD_EINVAL;
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    sqlite3_stmt *st = c->st[RS_EVENTS];
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int64(st, 2, after_seq);
    sqlite3_bind_int64(st, 3, limit);
    size_t cap = limit < 64 ? limit : 64, k = 0;
    struct jd_job_event *out = jd_xcalloc(cap, sizeof *out);
    int src;
    while (k < limit && (src = sqlite3_step(st)) == SQLITE_ROW) {
        struct jd_job_event first;
        row_to_event(st, &first);
        if (jd_evpack_expand(&first, (const char *)sqlite3_column_text(st, 6),
                             (size_t)sqlite3_column_bytes(st, 6), after_seq, &out, &k, &cap)) {
            src = SQLITE_CORRUPT;
            break;
        }
    }
    if (k >= limit) {
        src = SQLITE_DONE;
        for (size_t i = limit; i < k; i++)
            free(out[i].data);
        k = limit;
    }
    rc = step_rc(src);
    sqlite3_reset(st);
    rconn_put(s, c);
    if (rc) {
        jd_job_events_free(out, k);
        return rc;
    }
    *events = out;
    *n = k;
    return 0;
}

int jd_store_queue_counts(struct jd_store *s, struct jd_queue_counts **rows, size_t *n)
{
    if (s->pg)
        return jd_pg_queue_counts(s, rows, n);
    *rows = NULL;
    *n = 0;
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    /* Both queries in one read transaction: one consistent snapshot. */
    size_t cap = 8, k = 0;
    struct jd_queue_counts *out = jd_xcalloc(cap, sizeof *out);
    int src = sqlite3_step(c->st[RS_BEGIN]);
    sqlite3_reset(c->st[RS_BEGIN]);
    if (src != SQLITE_DONE)
        goto done;
    /* Both result sets come sorted by name: merge them. */
    sqlite3_stmt *qs = c->st[RS_QUEUES], *cs = c->st[RS_COUNTS];
    int qrc = sqlite3_step(qs), crc = sqlite3_step(cs);
    while (qrc == SQLITE_ROW || crc == SQLITE_ROW) {
        const char *qn = qrc == SQLITE_ROW ? (const char *)sqlite3_column_text(qs, 0) : NULL;
        const char *cn = crc == SQLITE_ROW ? (const char *)sqlite3_column_text(cs, 0) : NULL;
        const char *name = !qn ? cn : !cn ? qn : strcmp(qn, cn) <= 0 ? qn : cn;
        if (k == cap) {
            cap *= 2;
            out = jd_xrealloc(out, cap * sizeof *out);
        }
        struct jd_queue_counts *r = &out[k++];
        memset(r, 0, sizeof *r);
        r->queue = jd_xstrdup(name);
        if (qn && strcmp(qn, r->queue) == 0) {
            r->paused = sqlite3_column_int(qs, 1) != 0;
            qrc = sqlite3_step(qs);
        }
        while (crc == SQLITE_ROW &&
               strcmp((const char *)sqlite3_column_text(cs, 0), r->queue) == 0) {
            int state = sqlite3_column_int(cs, 1);
            if (state >= 0 && state < JD_JOB_NSTATES)
                r->counts[state] = sqlite3_column_int64(cs, 2);
            crc = sqlite3_step(cs);
        }
    }
    src = qrc != SQLITE_DONE ? qrc : crc;
    sqlite3_reset(qs);
    sqlite3_reset(cs);
    sqlite3_step(c->st[RS_COMMIT]);
    sqlite3_reset(c->st[RS_COMMIT]);
done:
    rc = step_rc(src);
    rconn_put(s, c);
    if (rc) {
        jd_queue_counts_free(out, k);
        return rc;
    }
    *rows = out;
    *n = k;
    return 0;
}

int jd_store_idem_lookup(struct jd_store *s, const char *key, int64_t *job_id, char **fingerprint)
{
    if (s->pg)
        return jd_pg_idem_lookup(s, key, job_id, fingerprint);
    if (fingerprint)
        *fingerprint = NULL;
    if (!key)
        return JD_EINVAL;
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    sqlite3_stmt *st = c->st[RS_IDEM];
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int src = sqlite3_step(st);
    if (src == SQLITE_ROW) {
        *job_id = sqlite3_column_int64(st, 0);
        if (fingerprint)
            *fingerprint = col_text(st, 1);
    }
    rc = src == SQLITE_ROW ? 0 : src == SQLITE_DONE ? JD_ENOENT : step_rc(src);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    rconn_put(s, c);
    return rc;
}

/* A read of at most one row of two integers, keyed by one text: 0 with
 * both set, JD_ENOENT for no row, or a JD_E* code. */
static int read_two_ints(struct jd_store *s, int which, const char *key, int64_t *a, int64_t *b)
{
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    sqlite3_stmt *st = c->st[which];
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int src = sqlite3_step(st);
    if (src == SQLITE_ROW) {
        *a = sqlite3_column_int64(st, 0);
        *b = sqlite3_column_int64(st, 1);
    }
    rc = src == SQLITE_ROW ? 0 : src == SQLITE_DONE ? JD_ENOENT : step_rc(src);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    rconn_put(s, c);
    return rc;
}

int jd_store_oldest_queued(struct jd_store *s, const char *queue, int64_t *job_id,
                           int64_t *created_ms)
{
    if (s->pg)
        return jd_pg_oldest_queued(s, queue, job_id, created_ms);
    if (!queue)
        return JD_EINVAL;
    return read_two_ints(s, RS_OLDEST_QUEUED, queue, job_id, created_ms);
}

/* Steps the nst (1 to 3) statements js, bound by the caller and each
 * ascending by job id, merged by id, and calls fn for each row with its
 * events of kind > 0 (RS_RECOVER_EVENTS), as jd_store_recover documents.
 * *rows counts the rows handed to fn. Returns the SQLite rc of the read
 * (SQLITE_DONE when it ended or fn stopped it); *stop_rc is fn's non-zero
 * return, if any. Resets js. */
static int read_jobs_with_events(struct jd_rconn *c, sqlite3_stmt *const *js, int nst,
                                 jd_store_job_fn fn, void *arg, size_t *rows, int *stop_rc)
{
    sqlite3_stmt *es = c->st[RS_RECOVER_EVENTS];
    size_t cap = 16;
    struct jd_job_event *ev = jd_xcalloc(cap, sizeof *ev);
    int src[3] = {SQLITE_DONE, SQLITE_DONE, SQLITE_DONE}, out = SQLITE_DONE;
    for (int i = 0; i < nst; i++)
        src[i] = sqlite3_step(js[i]);
    for (;;) {
        int pick = -1;
        for (int i = 0; i < nst; i++) {
            if (src[i] != SQLITE_ROW && src[i] != SQLITE_DONE)
                out = src[i];
            else if (src[i] == SQLITE_ROW && (pick < 0 || sqlite3_column_int64(js[i], 0) <
                                                              sqlite3_column_int64(js[pick], 0)))
                pick = i;
        }
        if (out != SQLITE_DONE || pick < 0)
            break;
        struct jd_job job;
        row_to_job(js[pick], &job);
        size_t k = 0;
        int erc = SQLITE_DONE;
        /* Version 1 is the insert's own event (kind 0) and nothing else: no
         * probe of events (most of a page of queued jobs: a backlog drain). */
        if (job.version > 1)
            sqlite3_bind_int64(es, 1, job.id);
        while (job.version > 1 && (erc = sqlite3_step(es)) == SQLITE_ROW) {
            struct jd_job_event first;
            row_to_event(es, &first);
            size_t from = k;
            if (jd_evpack_expand(&first, (const char *)sqlite3_column_text(es, 6),
                                 (size_t)sqlite3_column_bytes(es, 6), 0, &ev, &k, &cap)) {
                erc = SQLITE_CORRUPT;
                break;
            }
            k = from + jd_evpack_drop_state(ev + from, k - from);
        }
        sqlite3_reset(es);
        if (erc == SQLITE_DONE) {
            (*rows)++;
            *stop_rc = fn(arg, &job, ev, k);
        }
        for (size_t i = 0; i < k; i++)
            free(ev[i].data);
        jd_job_clear(&job);
        if (erc != SQLITE_DONE) {
            out = erc;
            break;
        }
        if (*stop_rc)
            break;
        src[pick] = sqlite3_step(js[pick]);
    }
    free(ev);
    for (int i = 0; i < nst; i++)
        sqlite3_reset(js[i]);
    return out;
}

/* A read connection in a read transaction, so jobs and their events come
 * from one snapshot (ended by read_end): 0 or a JD_E* code. */
static int read_begin(struct jd_store *s, struct jd_rconn **out)
{
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    int src = sqlite3_step(c->st[RS_BEGIN]);
    sqlite3_reset(c->st[RS_BEGIN]);
    if (src != SQLITE_DONE) {
        rconn_put(s, c);
        return step_rc(src);
    }
    *out = c;
    return 0;
}

static int read_end(struct jd_store *s, struct jd_rconn *c, int src, int stop_rc)
{
    int rc = step_rc(src);
    if (rc == 0 && stop_rc < 0)
        rc = stop_rc; /* the callback's own error */
    sqlite3_step(c->st[RS_COMMIT]);
    sqlite3_reset(c->st[RS_COMMIT]);
    rconn_put(s, c);
    return rc;
}

/* Recovery reads: the statements `which` (nst of them, unbound), merged
 * by id, each job with its events, in one snapshot. */
static int recover_read(struct jd_store *s, const int *which, int nst, jd_store_job_fn fn,
                        void *arg)
{
    struct jd_rconn *c;
    int rc = read_begin(s, &c);
    if (rc)
        return rc;
    size_t rows = 0;
    int stop_rc = 0;
    sqlite3_stmt *js[3];
    for (int i = 0; i < nst; i++)
        js[i] = c->st[which[i]];
    int src = read_jobs_with_events(c, js, nst, fn, arg, &rows, &stop_rc);
    return read_end(s, c, src, stop_rc);
}

int jd_store_recover(struct jd_store *s, jd_store_job_fn fn, void *arg)
{
    if (s->pg)
        return jd_pg_recover(s, fn, arg);
    static const int which[] = {RS_QUEUED_ALL, RS_RUNNING, RS_WAITING};
    return recover_read(s, which, 3, fn, arg);
}

int jd_store_recover_started(struct jd_store *s, jd_store_job_fn fn, void *arg)
{
    if (s->pg)
        return jd_pg_recover_started(s, fn, arg);
    static const int which[] = {RS_RUNNING, RS_WAITING};
    return recover_read(s, which, 2, fn, arg);
}

int jd_store_queued_page(struct jd_store *s, const char *queue, struct jd_queued_pos after,
                         int64_t due_ms, unsigned limit, jd_store_job_fn fn, void *arg, size_t *n)
{
    if (s->pg)
        return jd_pg_queued_page(s, queue, after, due_ms, limit, fn, arg, n);
    *n = 0;
    if (!queue || limit < 1 || limit > JD_QUEUED_PAGE_MAX)
        return JD_EINVAL;
    struct jd_rconn *c;
    int rc = read_begin(s, &c);
    if (rc)
        return rc;
    int src = SQLITE_DONE, stop_rc = 0;
    static const int which[2] = {RS_QUEUED_SAME, RS_QUEUED_LOWER};
    for (int i = 0; i < 2 && src == SQLITE_DONE && !stop_rc && *n < limit; i++) {
        sqlite3_stmt *st = c->st[which[i]];
        sqlite3_bind_text(st, 1, queue, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, after.priority);
        sqlite3_bind_int64(st, 3, after.id);
        sqlite3_bind_int64(st, 4, due_ms);
        sqlite3_bind_int64(st, 5, (int64_t)(limit - *n));
        src = read_jobs_with_events(c, &st, 1, fn, arg, n, &stop_rc);
        sqlite3_clear_bindings(st);
    }
    return read_end(s, c, src, stop_rc);
}

int jd_store_queued_later(struct jd_store *s, int64_t after_run_at_ms, int64_t after_id,
                          int64_t until_ms, unsigned limit, jd_store_job_fn fn, void *arg,
                          size_t *n)
{
    if (s->pg)
        return jd_pg_queued_later(s, after_run_at_ms, after_id, until_ms, limit, fn, arg, n);
    *n = 0;
    if (limit < 1 || limit > JD_QUEUED_PAGE_MAX)
        return JD_EINVAL;
    struct jd_rconn *c;
    int rc = read_begin(s, &c);
    if (rc)
        return rc;
    int stop_rc = 0;
    sqlite3_stmt *st = c->st[RS_QUEUED_LATER];
    sqlite3_bind_int64(st, 1, after_run_at_ms);
    sqlite3_bind_int64(st, 2, after_id);
    sqlite3_bind_int64(st, 3, until_ms);
    sqlite3_bind_int64(st, 4, limit);
    int src = read_jobs_with_events(c, &st, 1, fn, arg, n, &stop_rc);
    sqlite3_clear_bindings(st);
    return read_end(s, c, src, stop_rc);
}

/* The text columns of a read statement's rows, two (cols 2) or one per
 * row, into one array (names and values interleaved for two). */
static int read_strings(struct jd_store *s, int which, int cols, char ***names, size_t *n)
{
    *names = NULL;
    *n = 0;
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    sqlite3_stmt *st = c->st[which];
    size_t cap = 4, k = 0;
    char **out = jd_xcalloc(cap, sizeof *out);
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        for (int i = 0; i < cols; i++) {
            if (k == cap) {
                cap *= 2;
                out = jd_xrealloc(out, cap * sizeof *out);
            }
            out[k++] = col_text(st, i);
        }
    }
    rc = step_rc(src);
    sqlite3_reset(st);
    rconn_put(s, c);
    if (rc) {
        jd_strings_free(out, k);
        return rc;
    }
    *names = out;
    *n = k;
    return 0;
}

int jd_store_unique_keys(struct jd_store *s,
                         void (*fn)(void *arg, const char *key, int64_t job_id, int64_t expires_ms),
                         void *arg)
{
    if (s->pg)
        return jd_pg_unique_keys(s, fn, arg);
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    sqlite3_stmt *st = c->st[RS_UNIQUE_KEYS];
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW)
        fn(arg, (const char *)sqlite3_column_text(st, 0), sqlite3_column_int64(st, 1),
           sqlite3_column_int64(st, 2));
    rc = step_rc(src);
    sqlite3_reset(st);
    rconn_put(s, c);
    return rc;
}

int jd_store_paused_queues(struct jd_store *s, char ***names, size_t *n)
{
    if (s->pg)
        return jd_pg_paused_queues(s, names, n);
    return read_strings(s, RS_PAUSED, 1, names, n);
}

int jd_store_queue_configs(struct jd_store *s, char ***pairs, size_t *n)
{
    if (s->pg)
        return jd_pg_queue_configs(s, pairs, n);
    return read_strings(s, RS_QCONFIG, 2, pairs, n);
}

/* ---- schedules ---- */

static void row_to_schedule(sqlite3_stmt *st, struct jd_schedule_row *r)
{
    r->id = col_text(st, 0);
    r->definition = col_text(st, 1);
    r->paused = sqlite3_column_int(st, 2) != 0;
    r->retired = sqlite3_column_int(st, 3) != 0;
    r->next_fire_ms = sqlite3_column_int64(st, 4);
    r->last_fire_ms = sqlite3_column_int64(st, 5);
    r->last_job_id = sqlite3_column_int64(st, 6);
    r->last_outcome = col_text(st, 7);
    r->fires = sqlite3_column_int64(st, 8);
    r->skips = sqlite3_column_int64(st, 9);
    r->event_seq = sqlite3_column_int64(st, 10);
    r->created_ms = sqlite3_column_int64(st, 11);
    r->updated_ms = sqlite3_column_int64(st, 12);
    r->anchor_ms = sqlite3_column_int64(st, 13);
}

int jd_store_schedule_get(struct jd_store *s, const char *id, struct jd_schedule_row *out)
{
    if (s->pg)
        return jd_pg_schedule_get(s, id, out);
    memset(out, 0, sizeof *out);
    if (!id)
        return JD_EINVAL;
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    sqlite3_stmt *st = c->st[RS_SCHED_GET];
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int src = sqlite3_step(st);
    if (src == SQLITE_ROW)
        row_to_schedule(st, out);
    rc = src == SQLITE_ROW ? 0 : src == SQLITE_DONE ? JD_ENOENT : step_rc(src);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    rconn_put(s, c);
    return rc;
}

int jd_store_schedule_list(struct jd_store *s, const char *after, unsigned limit,
                           struct jd_schedule_row **rows, size_t *n, char **next_cursor)
{
    if (s->pg)
        return jd_pg_schedule_list(s, after, limit, rows, n, next_cursor);
    *rows = NULL;
    *n = 0;
    *next_cursor = NULL;
    if (limit < 1 || limit > 1000)
        return JD_EINVAL;
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    sqlite3_stmt *st = c->st[RS_SCHED_LIST];
    sqlite3_bind_text(st, 1, after ? after : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (int64_t)limit + 1); /* one extra: is there a next page? */
    struct jd_schedule_row *out = jd_xcalloc(limit + 1, sizeof *out);
    size_t k = 0;
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW)
        row_to_schedule(st, &out[k++]);
    rc = step_rc(src);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    rconn_put(s, c);
    if (rc) {
        jd_schedule_rows_free(out, k);
        return rc;
    }
    if (k > limit) {
        jd_schedule_row_clear(&out[--k]);
        *next_cursor = jd_xstrdup(out[k - 1].id);
    }
    *rows = out;
    *n = k;
    return 0;
}

int jd_store_schedule_events(struct jd_store *s, const char *id, int64_t after_seq, unsigned limit,
                             struct jd_schedule_event **events, size_t *n)
{
    if (s->pg)
        return jd_pg_schedule_events(s, id, after_seq, limit, events, n);
    *events = NULL;
    *n = 0;
    if (!id || limit < 1 || limit > 10000)
        return JD_EINVAL;
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    sqlite3_stmt *st = c->st[RS_SCHED_EVENTS];
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after_seq);
    sqlite3_bind_int64(st, 3, limit);
    size_t cap = limit < 64 ? limit : 64, k = 0;
    struct jd_schedule_event *out = jd_xcalloc(cap, sizeof *out);
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        if (k == cap) {
            cap *= 2;
            out = jd_xrealloc(out, cap * sizeof *out);
        }
        struct jd_schedule_event *e = &out[k++];
        e->seq = sqlite3_column_int64(st, 0);
        e->time_ms = sqlite3_column_int64(st, 1);
        e->fire_ms = sqlite3_column_int64(st, 2);
        e->job_id = sqlite3_column_int64(st, 3);
        e->kind = col_text(st, 4);
        e->data = col_text(st, 5);
    }
    rc = step_rc(src);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    rconn_put(s, c);
    if (rc) {
        jd_schedule_events_free(out, k);
        return rc;
    }
    *events = out;
    *n = k;
    return 0;
}

/* ---- remote commands and tasks ---- */

void jd_rcmd_rows_free(struct jd_rcmd_row *rows, size_t n)
{
    for (size_t i = 0; rows && i < n; i++) {
        free(rows[i].name);
        free(rows[i].description);
    }
    free(rows);
}

int jd_store_commands(struct jd_store *s, struct jd_rcmd_row **rows, size_t *n)
{
    if (s->pg)
        return jd_pg_commands(s, rows, n);
    *rows = NULL;
    *n = 0;
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    sqlite3_stmt *st = c->st[RS_RCMD_LIST];
    size_t k = 0, cap = 0;
    struct jd_rcmd_row *out = NULL;
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        if (k == cap) {
            cap = cap ? cap * 2 : 16;
            out = jd_xrealloc(out, cap * sizeof *out);
        }
        out[k].name = col_text(st, 0);
        out[k].timeout_ms = sqlite3_column_int64(st, 1);
        out[k].description = col_text(st, 2);
        out[k].created_ms = sqlite3_column_int64(st, 3);
        out[k].updated_ms = sqlite3_column_int64(st, 4);
        out[k].max_in_flight = sqlite3_column_int64(st, 5);
        k++;
    }
    rc = src == SQLITE_DONE ? 0 : step_rc(src);
    sqlite3_reset(st);
    rconn_put(s, c);
    if (rc) {
        jd_rcmd_rows_free(out, k);
        return rc;
    }
    *rows = out;
    *n = k;
    return 0;
}

int jd_store_task_state(struct jd_store *s, const char *id, int *state, int64_t *job_id)
{
    if (s->pg)
        return jd_pg_task_state(s, id, state, job_id);
    if (!id)
        return JD_EINVAL;
    int64_t st = 0;
    int rc = read_two_ints(s, RS_TASK_STATE, id, &st, job_id);
    *state = (int)st;
    return rc;
}

void jd_store_write_barrier(struct jd_write *w)
{
    w->op = JD_W_SYNC_;
}

static void release_done(void *arg, struct jd_write *w, int rc)
{
    (void)w;
    (void)rc;
    free(arg);
}

/* On the writer thread, when it is idle with release_wanted set
 * (writer.c): the idle read connections' page caches (a connection in use
 * keeps its own). */
void jd_store_release_readers(struct jd_store *s)
{
    if (s->pg)
        return; /* PostgreSQL keeps its cache in the server, not here */
    pthread_mutex_lock(&s->pool_mu);
    for (struct jd_rconn *c = s->pool; c; c = c->next)
        sqlite3_db_release_memory(c->db);
    pthread_mutex_unlock(&s->pool_mu);
}

void jd_store_release_memory(struct jd_store *s)
{
    atomic_store(&s->release_wanted, 1);
    /* A barrier wakes the writer, which then finds the flag when idle. */
    struct jd_write *w = jd_xcalloc(1, sizeof *w);
    jd_store_write_barrier(w);
    w->done = release_done;
    w->arg = w;
    if (jd_store_submit(s, w) != 0)
        free(w);
}

int jd_store_task_claimed(struct jd_store *s, int64_t job_id, uint32_t tag, uint32_t attempt,
                          bool *claimed)
{
    if (s->pg)
        return jd_pg_task_claimed(s, job_id, tag, attempt, claimed);
    *claimed = false;
    struct jd_rconn *c;
    int rc = rconn_get(s, &c);
    if (rc)
        return rc;
    sqlite3_stmt *st = c->st[RS_TASK_CLAIMED];
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int64(st, 2, tag);
    sqlite3_bind_int64(st, 3, attempt);
    int src = sqlite3_step(st);
    *claimed = src == SQLITE_ROW;
    rc = src == SQLITE_ROW || src == SQLITE_DONE ? 0 : step_rc(src);
    sqlite3_reset(st);
    rconn_put(s, c);
    return rc;
}

/* ---- the cluster (storage/pg_cluster.c); SQLite is one node alone ---- */

bool jd_store_clustered(const struct jd_store *s)
{
    return s->pg != NULL;
}

int64_t jd_store_node_id(const struct jd_store *s)
{
    return s->pg ? jd_pg_node_id(s) : 0;
}

int jd_store_cluster_start(struct jd_store *s, const struct jd_store_cluster_hooks *h)
{
    return s->pg ? jd_pg_cluster_start(s, h) : JD_EINVAL;
}

bool jd_store_lease_ok(struct jd_store *s)
{
    return s->pg ? jd_pg_lease_ok(s) : true;
}

bool jd_store_is_leader(struct jd_store *s)
{
    return s->pg ? jd_pg_is_leader(s) : true;
}

bool jd_store_healthy(struct jd_store *s)
{
    return s->pg ? jd_pg_healthy(s) : true;
}

int jd_store_claim(struct jd_store *s, unsigned limit, jd_store_job_fn fn, void *arg, size_t *n)
{
    *n = 0;
    if (limit < 1 || limit > 256)
        return JD_EINVAL;
    return s->pg ? jd_pg_claim(s, limit, fn, arg, n) : 0;
}

int jd_store_claim_id(struct jd_store *s, int64_t id)
{
    return s->pg ? jd_pg_claim_id(s, id) : JD_EINVAL;
}

int jd_store_requests(struct jd_store *s, int64_t after_id, unsigned limit,
                      struct jd_job_request **rows, size_t *n)
{
    *rows = NULL;
    *n = 0;
    if (limit < 1 || limit > 1000)
        return JD_EINVAL;
    return s->pg ? jd_pg_requests(s, after_id, limit, rows, n) : 0;
}

void jd_job_requests_free(struct jd_job_request *rows, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(rows[i].data);
    free(rows);
}

void jd_store_cluster_stats(struct jd_store *s, struct jd_cluster_stats *out)
{
    memset(out, 0, sizeof *out);
    if (s->pg)
        jd_pg_cluster_stats(s, out);
}
