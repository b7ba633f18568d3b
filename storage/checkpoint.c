/*
 * WAL checkpoints off the writer thread.
 *
 * SQLite's default copies the WAL back into the database inside the commit
 * that crosses 1000 pages, so one unlucky commit (and every record waiting
 * on it) pays for the copy and its fsync. Here the writer's connection has
 * auto-checkpoints off; its WAL hook (called after every commit, on the
 * writer thread) wakes a checkpointer thread once the WAL holds
 * JD_CKPT_SOFT_FRAMES, and that thread runs a PASSIVE checkpoint on its own
 * connection while the writer keeps committing.
 *
 * A passive checkpoint never waits for readers or the writer, so under
 * sustained writes it may never catch up completely and the WAL would only
 * grow. Past JD_CKPT_HARD_FRAMES the writer runs a passive checkpoint itself
 * between commits: by then the background thread has copied most frames, so
 * what is left is short, and once nothing is left the next commit starts the
 * WAL file over from its beginning.
 *
 * A checkpoint counts (jd_store_stats) only when it copied frames.
 *
 * Threading: the hook runs on the writer thread; the checkpointer thread
 * owns cdb; ckpt_wanted/ckpt_stop are guarded by ckpt_mu.
 */
#include "storage/store_impl.h"

#include "common/error.h"
#include "common/log.h"

#include <string.h>

#define JD_CKPT_SOFT_FRAMES 2000  /* ~8 MiB of WAL: wake the checkpointer */
#define JD_CKPT_HARD_FRAMES 16000 /* ~64 MiB: the writer checkpoints the rest itself */

static int wal_hook(void *arg, sqlite3 *db, const char *schema, int frames)
{
    struct jd_store *s = arg;
    if (frames >= JD_CKPT_HARD_FRAMES) {
        int log = 0, done = 0;
        if (sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done) ==
                SQLITE_OK &&
            done > 0)
            atomic_fetch_add_explicit(&s->st_checkpoints, 1,
                                      memory_order_relaxed); /* a statistic */
        return SQLITE_OK;
    }
    if (frames >= JD_CKPT_SOFT_FRAMES) {
        pthread_mutex_lock(&s->ckpt_mu);
        if (!s->ckpt_wanted) {
            s->ckpt_wanted = true;
            pthread_cond_signal(&s->ckpt_cv);
        }
        pthread_mutex_unlock(&s->ckpt_mu);
    }
    return SQLITE_OK;
}

static void *checkpointer_main(void *arg)
{
    struct jd_store *s = arg;
    pthread_mutex_lock(&s->ckpt_mu);
    for (;;) {
        while (!s->ckpt_wanted && !s->ckpt_stop)
            pthread_cond_wait(&s->ckpt_cv, &s->ckpt_mu);
        if (s->ckpt_stop)
            break;
        pthread_mutex_unlock(&s->ckpt_mu);
        int log = 0, done = 0;
        int rc = sqlite3_wal_checkpoint_v2(s->cdb, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
        if (rc == SQLITE_OK) {
            if (done > 0) /* relaxed: a statistic */
                atomic_fetch_add_explicit(&s->st_checkpoints, 1, memory_order_relaxed);
        } else if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED)
            jd_log(JD_LOG_WARN, "storage checkpoint failed", "db", s->path, "error",
                   sqlite3_errmsg(s->cdb), NULL);
        pthread_mutex_lock(&s->ckpt_mu);
        /* Commits during the copy may have asked again; one more pass then. */
        s->ckpt_wanted = false;
    }
    pthread_mutex_unlock(&s->ckpt_mu);
    return NULL;
}

int jd_checkpointer_start(struct jd_store *s, struct jd_error *err)
{
    int rc = sqlite3_open_v2(s->path, &s->cdb, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
    /* A connection learns that the file is in WAL mode only when it first
     * reads it; until then sqlite3_wal_checkpoint_v2 on it returns SQLITE_OK
     * having done nothing (log and done -1). */
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(s->cdb, "PRAGMA schema_version", NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(s->wdb, "PRAGMA wal_autocheckpoint = 0", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return jd_error_set(err, jd_store_sqlite_rc(rc) ? jd_store_sqlite_rc(rc) : JD_EIO, NULL,
                            "database %s: cannot open the checkpoint connection: %s", s->path,
                            sqlite3_errstr(rc));
    rc = pthread_create(&s->ckpt, NULL, checkpointer_main, s);
    if (rc != 0)
        return jd_error_set(err, JD_EIO, NULL, "database %s: cannot start the checkpointer: %s",
                            s->path, strerror(rc));
    pthread_setname_np(s->ckpt, "jd-checkpoint");
    s->ckpt_started = true;
    sqlite3_wal_hook(s->wdb, wal_hook, s);
    return 0;
}

void jd_checkpointer_stop(struct jd_store *s)
{
    if (s->ckpt_started) {
        pthread_mutex_lock(&s->ckpt_mu);
        s->ckpt_stop = true;
        pthread_cond_signal(&s->ckpt_cv);
        pthread_mutex_unlock(&s->ckpt_mu);
        pthread_join(s->ckpt, NULL);
        s->ckpt_started = false;
    }
    if (s->cdb) {
        sqlite3_close(s->cdb);
        s->cdb = NULL;
    }
}
