/*
 * Internals of the schedule engine shared by its files. Not a public
 * contract (that is server/schedules.h): only server/schedules*.c include
 * it.
 *
 *   schedules.c        the table of schedules (hash, references), create
 *                      (loading the stored schedules), stop, destroy
 *   schedules_spec.c   a definition: parse and validate, next fire, jitter
 *   schedules_fire.c   timers, fire decisions (fire, skip, catch up,
 *                      retire) and their commits, watching the last job
 *   schedules_ops.c    records on their way to the store (struct op), PUT,
 *                      pause/resume, delete, trigger and their commits
 *   schedules_read.c   the JSON reads (get, list, events) and statistics
 *   schedules_cluster.c (a clustered store) only the leader node fires;
 *                      other nodes' changes are re-read from the store
 *
 * State: every schedule has a struct sched in a hash under S->mu. Its
 * durable truth is the schedules row; the struct mirrors what has
 * committed, plus what is in flight:
 *   - busy: a fire (or a skip, a catch-up decision) is being committed. At
 *     most one per schedule; its commit callback arms the next timer.
 *   - ops: PUT, pause/resume and DELETE records being committed. While any
 *     is in flight no fire is decided; the last one to commit arms.
 * Every record about one schedule is submitted under S->mu, so the store
 * commits them in the order they were decided, and their callbacks (one
 * completion thread, commit order) apply them to the struct in that order.
 *
 * Timers: one pending timer per live schedule, armed for its next fire
 * time (plus a jitter fixed by id and fire time). A timer carries the
 * sequence number it was armed with; a later arm, pause or delete bumps
 * the number, so a timer that was already running when it was cancelled
 * finds itself stale and does nothing.
 *
 * Overlap: the job of the last fire is watched (jd_jobs_watch, terminal
 * only); the watch stores the id of the newest job known finished in an
 * atomic, so the fire decision reads it without locks.
 *
 * Threading: API calls on any thread; timer callbacks on the scheduler's
 * timer thread; commit callbacks on the store's completion thread; watch
 * callbacks wherever the job layer runs them. Lock order: S->mu, then the
 * job layer's and the store's own locks (jd_jobs_watch, which may call back
 * at once, is never called under S->mu). A function whose comment says
 * "Under mu" expects S->mu held; "Not under mu" means it must not be held.
 */
#ifndef JD_SERVER_SCHEDULES_IMPL_H
#define JD_SERVER_SCHEDULES_IMPL_H

#include "common/cron.h"
#include "common/tz.h"
#include "server/jobs.h"
#include "server/schedules.h"
#include "storage/store.h"

#include <cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DEFAULT_MAX_SCHEDULES 10000
#define DEFAULT_MAX_BODY (64 * 1024) /* a definition, not a data set */
#define DEFAULT_GRACE_MS 5000        /* late by less than this: a fire, not a missed one */
#define RETRY_MS 1000                /* after a failed commit (full disk), try again */
#define MAX_JITTER_MS 3600000        /* an hour */
#define MAX_LABELS 32
#define COUNT_LIMIT 100000   /* missed fires counted one by one at most (cron) */
#define RESEED_S (7 * 86400) /* then counting restarts this long before now */
#define NBUCKETS 4096

enum overlap { OV_SKIP, OV_ALLOW, OV_CANCEL };
enum catchup { CU_NONE, CU_LATEST, CU_ALL };
extern const char *const schedules_overlap_names[]; /* by enum overlap, NULL-terminated */
extern const char *const schedules_catchup_names[]; /* by enum catchup, NULL-terminated */

/* A parsed definition. */
struct spec {
    bool is_cron;
    struct jd_cron cron;
    const struct jd_tz *tz;
    int64_t every_ms;
    enum overlap overlap;
    enum catchup catchup;
    int64_t start_at, end_at, jitter_ms; /* 0: none */
    bool paused;                         /* as the body said (PUT only) */
    char *def_text; /* what is stored: the body, normalised (freed once stored: reads
                       render the row, so memory holds only what fires need) */
    char *job_text; /* the job to submit, labels merged */
};

struct sched {
    char *id;
    struct spec sp;
    int64_t anchor_ms;
    bool paused, retired, loaded; /* loaded: its definition has committed */
    bool deleting, gone;
    int64_t next_fire_ms;  /* committed next fire; 0: none */
    int64_t last_job_id;   /* the newest job a fire made */
    int64_t catchup_until; /* catchup "all": fires up to here are caught up one by one */
    bool busy;
    unsigned ops;
    uint64_t timer_id, timer_seq;
    bool timer_armed;
    struct tarm *tarm;        /* the armed timer's argument */
    uint64_t watch_id;        /* the newest watch on one of our jobs, or 0 */
    struct wctx *watch_ctx;   /* its argument (freed by whoever ends the watch) */
    _Atomic int64_t done_job; /* newest job of ours known finished */
    atomic_int refs;
    struct sched *next; /* hash chain */
};

struct jd_schedules {
    struct jd_store *store;
    struct jd_jobs *jobs;
    unsigned max_schedules;
    size_t max_body;
    int64_t grace_ms;
    struct jd_schedules_timers timers;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when busy_total drops */
    struct sched *tab[NBUCKETS];
    size_t count; /* live schedules, including ones being created */
    unsigned busy_total;
    unsigned tarms; /* timers armed or running */
    bool stopped;
    atomic_uint ops_live;     /* struct op allocated (stop waits for them to finish) */
    struct sched_cluster *cl; /* a clustered store (schedules_cluster.c), or NULL */

    /* statistics (relaxed: independent counters) */
    atomic_uint_least64_t st_fires, st_skips, st_caught_up, st_retired, st_lag_sum;
    atomic_uint_least64_t st_lag[JD_SCHED_LAG_BUCKETS];
};

enum op_kind { OP_FIRE, OP_CHANGE, OP_PUT, OP_DELETE, OP_PAUSE, OP_TRIGGER };

/* One decision on its way to the store. */
struct op {
    enum op_kind kind;
    struct jd_schedules *S;
    struct sched *sc; /* referenced */
    struct jd_write w[2];
    size_t nw;
    int64_t fire_ms, next_ms, job_id;
    bool retire, set_last, created;
    char key[JD_SCHEDULE_ID_MAX + 64];
    char *data, *data2;
    struct spec sp; /* OP_PUT: the new definition */
    int64_t anchor_ms;
    bool paused; /* OP_PUT, OP_PAUSE */
    jd_schedule_done_fn done;
    void *arg;
};

/* A watch on the job of a schedule's last fire. */
struct wctx {
    struct sched *sc; /* referenced */
    int64_t job_id;
};

/* schedules.c: the table */
void schedules_ref(struct sched *sc);
void schedules_unref(struct sched *sc); /* the last one frees sc */
size_t schedules_bucket_of(const char *id);
struct sched *schedules_find(struct jd_schedules *S, const char *id); /* under mu */
void schedules_unlink(struct jd_schedules *S, struct sched *sc);      /* under mu */

/* schedules_spec.c: definitions */
void schedules_spec_clear(struct spec *sp);
int schedules_spec_parse(struct jd_schedules *S, const char *id, cJSON *root, bool validate_job,
                         struct spec *sp, struct jd_error *err);
int64_t schedules_spec_next(const struct spec *sp, int64_t anchor_ms, int64_t after);
int64_t schedules_jitter_for(const struct sched *sc, int64_t fire_ms);
void schedules_pointer_under(struct jd_error *err, const char *prefix);

/* schedules_fire.c: timers, fires, watches */
int schedules_timer_after(void *ctx, int64_t delay_ms, void (*fn)(void *), void *arg, uint64_t *id);
int schedules_timer_cancel(void *ctx, uint64_t id);
void schedules_arm(struct jd_schedules *S, struct sched *sc, int64_t delay_ms); /* under mu */
void schedules_disarm(struct jd_schedules *S, struct sched *sc);                /* under mu */
void schedules_busy_end(struct jd_schedules *S, struct sched *sc);              /* under mu */
void schedules_watch_job(struct jd_schedules *S, struct sched *sc,
                         int64_t job_id);                                       /* not under mu */
void schedules_unwatch(struct jd_schedules *S, uint64_t wid, struct wctx *ctx); /* not under mu */

/* schedules_ops.c: records */
struct op *schedules_op_new(struct jd_schedules *S, struct sched *sc, enum op_kind kind);
void schedules_op_free(struct op *o);
struct jd_write *schedules_op_change(struct op *o, const char *event, int64_t fire_ms,
                                     int64_t job_id, const char *data);
void schedules_op_advance(struct op *o, int64_t next_ms);
int schedules_submit_changes(struct jd_schedules *S, struct op *o); /* under mu */

/* schedules_read.c: JSON */
char *schedules_render(struct jd_schedules *S, const struct jd_schedule_row *row);

/* schedules.c: add a stored schedule to the table (under mu). */
struct sched *schedules_load_row(struct jd_schedules *S, const struct jd_schedule_row *row);

/* schedules_cluster.c (a clustered store; all no-ops for SQLite). */
void schedules_cluster_start(struct jd_schedules *S); /* create: the re-read thread */
void schedules_cluster_stop(struct jd_schedules *S);  /* stop: joins it (not under mu) */
void schedules_cluster_free(struct jd_schedules *S);
/* Under mu: whether this node may decide sc's fire now; if not, sc is
 * looked at again in a second (another node is the leader). */
bool schedules_cluster_may_fire_locked(struct jd_schedules *S, struct sched *sc);
/* Re-read schedule id from the store soon (a fire another node committed
 * first: JD_ECONFLICT). Any thread, with or without mu. */
void schedules_cluster_reread(struct jd_schedules *S, const char *id);

#endif
