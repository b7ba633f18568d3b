/*
 * Remote tasks, part 5 of 5 (see jobs_tasks.c): claims across cluster
 * nodes (server/tasks.h, "Claims across cluster nodes"). A task stays on
 * the node that made it; this file lets a worker claim it from any node:
 *
 *   announce  a task left waiting (no local parked claim took it) makes
 *             this node announce its command to the others ("<node>
 *             <name>:<waiting> ..."): at once, at
 *             most every JD_TASK_ANNOUNCE_MIN_MS per command, and again
 *             about once a second while its tasks wait (the announcement
 *             timer, armed only while something waits);
 *   remember  the announcements of other nodes, per command, for
 *             JD_TASK_ANNOUNCE_TTL_MS (ANN_NODES nodes per command; a node
 *             whose forwarded claim came back empty is forgotten at once);
 *   gather    a claim that wants more than this node has asks the
 *             announcing nodes in turn through jd_task_remote.claim (a
 *             non-waiting claim for the rest of its max) and answers with
 *             all it got, or parks for the rest of its wait when nothing
 *             came; a parked claim does the same (its own fetch, one at a
 *             time, FETCH_MAX at once) when a node announces one of its
 *             commands, oldest first, until their max covers the tasks
 *             announced (no herd of claims for one task). While a parked claim fetches it is not
 * served here and its deadline waits for the fetch, so whatever the fetch brings is answered, never
 * dropped (except by a drain); sync      remote commands registered, changed or deleted on another
 *             node (read from the store by the cluster thread once a
 *             second).
 *
 * Threads: tasks_gather on an HTTP thread (a claim), the store's
 * completion thread (the local part committed) or a forwarding thread (a
 * remote answer); jd_jobs_tasks_announced on the store's listener thread;
 * announce_tick on the timer thread; jobs_tasks_sync_commands on the
 * cluster thread. The remote hooks only queue, so they may be called under
 * tmu; user callbacks are called without it.
 */
#include "server/jobs_impl.h"
#include "server/jobs_tasks_impl.h"
#include "server/tasks.h"

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ANNOUNCE_EVERY_MS 1000 /* again while tasks wait, for nodes that missed one */
#define ANNOUNCE_TICK_MS JD_TASK_ANNOUNCE_MIN_MS
#define SYNC_QUIET_MS 5000 /* a local change this recent may not be committed yet */

void jd_jobs_set_task_remote(struct jd_jobs *j, const struct jd_task_remote *r)
{
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    if (r)
        t->remote = *r;
    else
        memset(&t->remote, 0, sizeof t->remote);
    pthread_mutex_unlock(&t->mu);
}

/* ---- announcing ---- */

static void announce_tick(void *arg);

/* Under tmu: the timer runs while anything waits or is due. */
static void announce_arm_locked(struct jd_jobs *j)
{
    struct jd_tasks *t = j->tasks;
    if (t->ann_armed || t->draining)
        return;
    if (jd_sched_timer_after(j->sched, (uint64_t)ANNOUNCE_TICK_MS * 1000000u, announce_tick, j,
                             &t->ann_timer) == 0)
        t->ann_armed = true;
}

/* Under tmu: "<me> <name> ..." for the commands that `due` selects (their
 * announced_ms set to now), split into payloads of at most
 * JD_STORE_ANNOUNCE_MAX bytes, returned as a NUL-separated list ending
 * with an empty string (caller frees), or NULL when none is due. */
static char *payloads_locked(struct jd_jobs *j, int64_t now)
{
    struct jd_tasks *t = j->tasks;
    struct jd_sbuf out = {0};
    char head[32];
    snprintf(head, sizeof head, "%" PRId64, jd_store_node_id(j->store));
    size_t cur = 0; /* the current payload's length */
    bool any = false;
    for (struct rcmd *c = t->cmds; c; c = c->next) {
        if (!c->registered || c->waiting == 0)
            continue;
        if (!c->announce_due && now - c->announced_ms < ANNOUNCE_EVERY_MS)
            continue;
        c->announce_due = false;
        c->announced_ms = now;
        char cnt[24];
        snprintf(cnt, sizeof cnt, ":%" PRIu64, c->waiting);
        size_t add = strlen(c->name) + strlen(cnt) + 1;
        if (cur == 0 || cur + add > JD_STORE_ANNOUNCE_MAX) {
            if (cur)
                jd_sb_put(&out, "", 1);
            jd_sb_puts(&out, head);
            cur = strlen(head);
        }
        jd_sb_put(&out, " ", 1);
        jd_sb_puts(&out, c->name);
        jd_sb_puts(&out, cnt);
        cur += add;
        any = true;
    }
    if (!any) {
        free(out.p);
        return NULL;
    }
    jd_sb_put(&out, "", 1);
    jd_sb_put(&out, "", 1);
    return out.p;
}

void tasks_announce_send(struct jd_jobs *j, char *payloads)
{
    struct jd_tasks *t = j->tasks;
    if (!payloads)
        return;
    pthread_mutex_lock(&t->mu);
    struct jd_task_remote rm = t->remote;
    pthread_mutex_unlock(&t->mu);
    for (char *p = payloads; *p && rm.announce; p += strlen(p) + 1)
        rm.announce(rm.arg, p);
    free(payloads);
}

char *tasks_left_waiting_locked(struct jd_jobs *j, struct rcmd *c)
{
    struct jd_tasks *t = j->tasks;
    if (!t->remote.announce || t->draining)
        return NULL;
    int64_t now = jobs_mono_ms();
    announce_arm_locked(j); /* re-announces while it waits */
    if (now - c->announced_ms < JD_TASK_ANNOUNCE_MIN_MS) {
        c->announce_due = true; /* the tick sends it */
        return NULL;
    }
    c->announce_due = true;
    return payloads_locked(j, now);
}

static void announce_tick(void *arg)
{
    struct jd_jobs *j = arg;
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    t->ann_armed = false;
    char *p = NULL;
    bool waiting = false;
    if (!t->draining && t->remote.announce) {
        p = payloads_locked(j, jobs_mono_ms());
        for (struct rcmd *c = t->cmds; c && !waiting; c = c->next)
            waiting = c->registered && (c->waiting > 0 || c->announce_due);
        if (waiting)
            announce_arm_locked(j);
    }
    pthread_mutex_unlock(&t->mu);
    tasks_announce_send(j, p);
}

/* ---- what other nodes announced ---- */

size_t tasks_announced_locked(struct jd_tasks *t, struct rcmd *const *cmds, size_t ncmds,
                              int64_t *nodes)
{
    int64_t now = jobs_mono_ms();
    size_t n = 0;
    for (size_t i = 0; i < ncmds; i++)
        for (unsigned s = 0; s < ANN_NODES && n < GATHER_NODES; s++) {
            struct rcmd *c = cmds[i];
            if (!c->ann_node[s] || c->ann_until_ms[s] <= now)
                continue;
            bool dup = false;
            for (size_t k = 0; k < n; k++)
                dup |= nodes[k] == c->ann_node[s];
            if (!dup)
                nodes[n++] = c->ann_node[s];
        }
    return n;
}

/* Under tmu: node announced c (or, until_ms 0, had none of its tasks). */
static void remember_locked(struct rcmd *c, int64_t node, int64_t until_ms)
{
    unsigned slot = ANN_NODES;
    for (unsigned s = 0; s < ANN_NODES && slot == ANN_NODES; s++)
        if (c->ann_node[s] == node)
            slot = s;
    if (until_ms == 0) {
        if (slot < ANN_NODES)
            c->ann_node[slot] = c->ann_until_ms[slot] = 0;
        return;
    }
    if (slot == ANN_NODES) { /* a free slot, or the one that ends first */
        slot = 0;
        for (unsigned s = 1; s < ANN_NODES; s++)
            if (c->ann_until_ms[s] < c->ann_until_ms[slot])
                slot = s;
    }
    c->ann_node[slot] = node;
    c->ann_until_ms[slot] = until_ms;
}

/* ---- gathering tasks from other nodes ---- */

struct gather {
    struct jd_jobs *j;
    uint64_t claimer; /* a parked claim's fetch, by id; 0: a claim being answered */
    jd_action_done_fn done;
    void *arg;
    struct rcmd **cmds;
    size_t ncmds;
    char *worker;
    unsigned max, want, got;
    int64_t lease_ms, wait_ms, t0_ms;
    int64_t nodes[GATHER_NODES];
    size_t nnodes, next;
    int rc;             /* the local part's commit failed */
    struct jd_sbuf out; /* the tasks gathered, comma-separated */
};

static void gather_next(struct gather *g);

static struct gather *gather_new(struct jd_jobs *j, struct rcmd *const *cmds, size_t ncmds,
                                 const char *worker, unsigned max, int64_t lease_ms,
                                 const int64_t *nodes, size_t nnodes)
{
    struct gather *g = jd_xcalloc(1, sizeof *g);
    g->j = j;
    g->cmds = jd_xcalloc(ncmds ? ncmds : 1, sizeof *g->cmds);
    memcpy(g->cmds, cmds, ncmds * sizeof *cmds);
    g->ncmds = ncmds;
    g->worker = jd_xstrdup(worker);
    g->max = g->want = max;
    g->lease_ms = lease_ms;
    g->t0_ms = jobs_mono_ms();
    g->nnodes = nnodes < GATHER_NODES ? nnodes : GATHER_NODES;
    memcpy(g->nodes, nodes, g->nnodes * sizeof *nodes);
    return g;
}

static void gather_free(struct gather *g)
{
    free(g->cmds);
    free(g->worker);
    free(g->out.p);
    free(g);
}

/* Add the tasks of a claim's answer ({"tasks":[...]}) to g; their count. */
static unsigned gather_add(struct gather *g, const char *json)
{
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "tasks");
    unsigned n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ts)
    {
        if (!cJSON_IsObject(it))
            continue;
        char *s = cJSON_PrintUnformatted(it);
        if (!s)
            continue;
        if (g->got++)
            jd_sb_put(&g->out, ",", 1);
        jd_sb_puts(&g->out, s);
        free(s);
        n++;
    }
    cJSON_Delete(o);
    g->want = g->want > n ? g->want - n : 0;
    return n;
}

static char *gather_answer(struct gather *g)
{
    return jd_xasprintf("{\"tasks\":[%s]}", g->out.p ? g->out.p : "");
}

/* A parked claim's fetch ended: answer it, keep it parked, or (a drain
 * answered it meanwhile) let what came back run out its lease. */
static void fetch_end(struct gather *g)
{
    struct jd_jobs *j = g->j;
    struct jd_tasks *t = j->tasks;
    pthread_mutex_lock(&t->mu);
    struct claimer *cl = NULL;
    for (struct claimer *x = t->claimers; x && !cl; x = x->next)
        if (x->id == g->claimer)
            cl = x;
    t->fetches--;
    if (!cl) {
        pthread_mutex_unlock(&t->mu);
        if (g->got)
            jd_logf(JD_LOG_WARN,
                    "%u tasks claimed from another node for a claim that ended meanwhile: "
                    "they are offered again when their lease runs out",
                    g->got);
        gather_free(g);
        return;
    }
    cl->fetching = false;
    struct claim_op *op = NULL;
    if (!g->got && !cl->expired)
        op = tasks_claim_take_locked(j, cl->cmds, cl->ncmds, cl->worker, cl->max, cl->lease_ms);
    if (!g->got && !cl->expired && !op) {
        pthread_mutex_unlock(&t->mu); /* stays parked */
        gather_free(g);
        return;
    }
    cl = tasks_claimer_unlink_locked(j, g->claimer);
    pthread_mutex_unlock(&t->mu);
    if (op) {
        tasks_claim_submit(j, op, cl->done, cl->arg);
    } else {
        char *a = gather_answer(g);
        cl->done(cl->arg, 0, a);
        free(a);
    }
    tasks_claimer_free(cl);
    gather_free(g);
}

/* A claim's gather ended: answer it, or park it when nothing came. */
static void gather_end(struct gather *g)
{
    struct jd_jobs *j = g->j;
    struct jd_tasks *t = j->tasks;
    if (g->claimer) {
        fetch_end(g);
        return;
    }
    int64_t left = g->wait_ms - (jobs_mono_ms() - g->t0_ms);
    if (g->rc == 0 && !g->got && left > 0) {
        pthread_mutex_lock(&t->mu);
        /* A task may have arrived here while the others were asked. */
        struct claim_op *op =
            tasks_claim_take_locked(j, g->cmds, g->ncmds, g->worker, g->max, g->lease_ms);
        int rc = op ? 0
                    : tasks_park_locked(j, g->cmds, g->ncmds, g->worker, g->max, g->lease_ms, left,
                                        g->done, g->arg);
        pthread_mutex_unlock(&t->mu);
        if (op)
            tasks_claim_submit(j, op, g->done, g->arg);
        else if (rc)
            g->done(g->arg, 0, "{\"tasks\":[]}"); /* draining */
        gather_free(g);
        return;
    }
    if (g->rc && !g->got) {
        g->done(g->arg, g->rc, NULL);
    } else {
        char *a = gather_answer(g);
        g->done(g->arg, 0, a);
        free(a);
    }
    gather_free(g);
}

static void gather_remote_done(void *arg, const char *json)
{
    struct gather *g = arg;
    int64_t node = g->nodes[g->next++];
    if (gather_add(g, json) == 0) {
        /* Nothing there (any more): forget it for these commands until it
         * announces again. */
        struct jd_tasks *t = g->j->tasks;
        pthread_mutex_lock(&t->mu);
        for (size_t i = 0; i < g->ncmds; i++)
            remember_locked(g->cmds[i], node, 0);
        pthread_mutex_unlock(&t->mu);
    }
    gather_next(g);
}

/* The claim for the rest, as POST /v1/tasks/claim takes it. */
static char *claim_body(const struct gather *g)
{
    struct jd_sbuf b = {0};
    jd_sb_puts(&b, "{\"commands\":[");
    for (size_t i = 0; i < g->ncmds; i++) {
        if (i)
            jd_sb_put(&b, ",", 1);
        jd_sb_string(&b, g->cmds[i]->name);
    }
    jd_sb_puts(&b, "],\"worker\":");
    jd_sb_string(&b, g->worker);
    jd_sb_puts(&b, ",\"max\":");
    jd_sb_number(&b, g->want);
    jd_sb_puts(&b, ",\"wait_ms\":0,\"lease_ms\":");
    jd_sb_number(&b, g->lease_ms);
    jd_sb_puts(&b, "}");
    return b.p;
}

static void gather_next(struct gather *g)
{
    struct jd_tasks *t = g->j->tasks;
    while (g->want > 0 && g->next < g->nnodes) {
        pthread_mutex_lock(&t->mu);
        struct jd_task_remote rm = t->remote;
        bool draining = t->draining;
        pthread_mutex_unlock(&t->mu);
        if (!rm.claim || draining)
            break;
        char *body = claim_body(g);
        int rc = rm.claim(rm.arg, g->nodes[g->next], body, gather_remote_done, g);
        free(body);
        if (rc == 0)
            return; /* gather_remote_done goes on */
        g->next++;
    }
    gather_end(g);
}

static void gather_local_done(void *arg, int rc, const char *json)
{
    struct gather *g = arg;
    if (rc)
        g->rc = rc;
    else
        gather_add(g, json);
    gather_next(g);
}

void tasks_gather(struct jd_jobs *j, struct claim_op *local, struct rcmd *const *cmds, size_t ncmds,
                  const char *worker, unsigned max, int64_t lease_ms, int64_t wait_ms,
                  const int64_t *nodes, size_t nnodes, jd_action_done_fn done, void *arg)
{
    struct gather *g = gather_new(j, cmds, ncmds, worker, max, lease_ms, nodes, nnodes);
    g->wait_ms = wait_ms;
    g->done = done;
    g->arg = arg;
    if (local)
        tasks_claim_submit(j, local, gather_local_done, g); /* then gather_next */
    else
        gather_next(g);
}

/* ---- announcements from other nodes ---- */

void jd_jobs_tasks_announced(struct jd_jobs *j, const char *payload)
{
    struct jd_tasks *t = j->tasks;
    char *end;
    long long node = strtoll(payload, &end, 10);
    if (node <= 0 || node == jd_store_node_id(j->store) || *end != ' ')
        return;
    int64_t until = jobs_mono_ms() + JD_TASK_ANNOUNCE_TTL_MS;
    struct gather *starts[FETCH_MAX];
    size_t nstarts = 0;
    pthread_mutex_lock(&t->mu);
    if (t->draining || !t->remote.claim) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    struct rcmd *named[JD_TASK_MAX_CLAIM_COMMANDS * 4];
    size_t nnamed = 0;
    uint64_t waiting = 0; /* tasks the node says wait: fetches stop once they cover them */
    for (const char *p = end; *p;) {
        while (*p == ' ')
            p++;
        size_t n = strcspn(p, " :");
        char name[NAME_MAX_LEN + 1];
        bool ok = n > 0 && n <= NAME_MAX_LEN;
        if (ok) {
            memcpy(name, p, n);
            name[n] = '\0';
        }
        p += n;
        uint64_t count = 1;
        if (*p == ':') {
            count = strtoull(p + 1, NULL, 10);
            p += 1 + strcspn(p + 1, " ");
        }
        struct rcmd *c = ok ? tasks_cmd_find(t, name) : NULL;
        if (c && c->registered && count > 0) {
            remember_locked(c, (int64_t)node, until);
            waiting += count < 1000000 ? count : 1000000;
            if (nnamed < sizeof named / sizeof named[0])
                named[nnamed++] = c;
        }
    }
    /* Parked claims for these commands ask that node, oldest first. */
    struct claimer *order[FETCH_MAX];
    size_t norder = 0;
    for (struct claimer *cl = t->claimers; cl; cl = cl->next) {
        if (cl->gone || cl->fetching || cl->expired)
            continue;
        bool wants = false;
        for (size_t i = 0; i < cl->ncmds && !wants; i++)
            for (size_t k = 0; k < nnamed && !wants; k++)
                wants = cl->cmds[i] == named[k];
        if (!wants)
            continue;
        if (t->claim_alive && !t->claim_alive(cl->arg)) {
            cl->gone = true;
            continue;
        }
        if (norder < FETCH_MAX)
            order[norder++] = cl; /* newest first: started from the end below */
    }
    uint64_t asked = 0;
    while (norder > 0 && t->fetches < FETCH_MAX && asked < waiting) {
        struct claimer *cl = order[--norder];
        asked += cl->max;
        int64_t n1 = (int64_t)node;
        struct gather *g =
            gather_new(j, cl->cmds, cl->ncmds, cl->worker, cl->max, cl->lease_ms, &n1, 1);
        g->claimer = cl->id;
        g->done = cl->done;
        g->arg = cl->arg;
        cl->fetching = true;
        t->fetches++;
        starts[nstarts++] = g;
    }
    pthread_mutex_unlock(&t->mu);
    for (size_t i = 0; i < nstarts; i++)
        gather_next(starts[i]);
}

/* ---- commands registered on other nodes ---- */

void jobs_tasks_sync_commands(struct jd_jobs *j)
{
    struct jd_tasks *t = j->tasks;
    if (!t)
        return;
    struct jd_rcmd_row *rows = NULL;
    size_t n = 0;
    int64_t now = jd_wall_ms();
    if (jd_store_commands(j->store, &rows, &n) != 0)
        return;
    /* Limits to apply after tmu (jobs_command_limit_set takes mu). */
    char **lim_names = jd_xcalloc(n + t->ncmds + 1, sizeof *lim_names);
    unsigned *lim_caps = jd_xcalloc(n + t->ncmds + 1, sizeof *lim_caps);
    size_t nlim = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < n; i++) {
        struct rcmd *c = tasks_cmd_find(t, rows[i].name);
        if (c && now - c->updated_ms < SYNC_QUIET_MS)
            continue; /* changed here lately: this node's own record wins */
        if (!c) {
            if (t->ncmds >= JD_TASK_MAX_COMMANDS)
                continue;
            c = jd_xcalloc(1, sizeof *c);
            c->name = jd_xstrdup(rows[i].name);
            c->next = t->cmds;
            t->cmds = c;
        }
        if (!c->registered) {
            if (t->ncmds >= JD_TASK_MAX_COMMANDS)
                continue;
            c->registered = true;
            t->ncmds++;
        }
        if (c->max_in_flight != rows[i].max_in_flight) {
            lim_names[nlim] = jd_xstrdup(c->name);
            lim_caps[nlim++] = (unsigned)rows[i].max_in_flight;
        }
        c->timeout_ms = rows[i].timeout_ms;
        c->max_in_flight = rows[i].max_in_flight;
        c->created_ms = rows[i].created_ms;
        c->updated_ms = rows[i].updated_ms;
        if ((c->description == NULL) != (rows[i].description == NULL) ||
            (c->description && strcmp(c->description, rows[i].description) != 0)) {
            free(c->description);
            c->description = rows[i].description ? jd_xstrdup(rows[i].description) : NULL;
        }
    }
    for (struct rcmd *c = t->cmds; c; c = c->next) {
        if (!c->registered || now - c->updated_ms < SYNC_QUIET_MS || c->waiting || c->in_flight)
            continue;
        bool stored = false;
        for (size_t i = 0; i < n && !stored; i++)
            stored = strcmp(rows[i].name, c->name) == 0;
        if (!stored) { /* deleted on another node */
            c->registered = false;
            t->ncmds--;
            lim_names[nlim] = jd_xstrdup(c->name);
            lim_caps[nlim++] = 0;
        }
    }
    pthread_mutex_unlock(&t->mu);
    for (size_t i = 0; i < nlim; i++) {
        jobs_command_limit_set(j, lim_names[i], lim_caps[i]);
        free(lim_names[i]);
    }
    free(lim_names);
    free(lim_caps);
    jd_rcmd_rows_free(rows, n);
}
