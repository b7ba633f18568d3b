/*
 * Running a process: its init (once, before the first step), collecting
 * its events, one step, the move to its next state (Ready, Blocked, Idle)
 * with the wake-up re-check, dispatching its yields through the hooks, and
 * its end (finish: the finished hook, close, recycling the slot).
 *
 * Threading: runs on a worker, only for a process that worker moved Ready
 * -> Running by CAS, so the control block's non-atomic fields (tags,
 * method, input, inited) are owned by it for the step. Senders on other
 * threads only push events and CAS the state word (sched.c wake()).
 */
#include "scheduler/sched_impl.h"

#include "common/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void free_event_payloads(struct jd_event *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(ev[i].data);
        free(ev[i].error);
    }
}

static bool take_tag(struct proc *p, uint32_t tag)
{
    for (uint32_t i = 0; i < p->ntags; i++) {
        if (p->tags[i] == tag) {
            p->tags[i] = p->tags[--p->ntags];
            return true;
        }
    }
    return false;
}

static void add_tag(struct proc *p, uint32_t tag)
{
    if (p->ntags == p->tagcap) {
        p->tagcap = p->tagcap ? p->tagcap * 2 : 4;
        p->tags = jd_xrealloc(p->tags, p->tagcap * sizeof(*p->tags));
    }
    p->tags[p->ntags++] = tag;
}

static void drop_event(struct jd_sched *s, struct worker *w, struct evnode *e)
{
    free(e->data);
    free(e->error);
    ev_release(s, w, e);
}

/* Drain the process's events into w->evbuf. Returns the count; if a kill
 * event is found, *kill receives its text (owned) and the rest are dropped. */
static size_t collect_events(struct worker *w, struct proc *p, uint32_t gen, char **kill,
                             bool *killed)
{
    struct jd_sched *s = w->s;
    size_t n = 0;
    struct jd_link *l = jd_mpsc_take_all(&p->events);
    while (l) {
        struct evnode *e = (struct evnode *)l;
        l = l->next;
        if (e->gen != gen || *killed ||
            (e->type == JD_EVENT_YIELD_COMPLETE && !take_tag(p, e->tag))) {
            if (e->type != EV_KILL)
                count_stale(s, w);
            drop_event(s, w, e);
            continue;
        }
        if (e->type == EV_KILL) {
            *killed = true;
            *kill = e->data;
            e->data = NULL;
            drop_event(s, w, e);
            continue;
        }
        if (n == w->evcap) {
            w->evcap = w->evcap ? w->evcap * 2 : 16;
            w->evbuf = jd_xrealloc(w->evbuf, w->evcap * sizeof(*w->evbuf));
        }
        struct jd_event *ev = &w->evbuf[n++];
        ev->type = (enum jd_event_type)e->type;
        ev->tag = e->tag;
        ev->value = e->value;
        ev->data = e->data;
        ev->error = e->error;
        ev_release(s, w, e);
    }
    if (*killed) {
        free_event_payloads(w->evbuf, n);
        n = 0;
    }
    return n;
}

/* The process is Running and ours: complete it, recycle the slot. */
static void finish(struct worker *w, struct proc *p, uint32_t gen, enum jd_step_status status,
                   const char *result, const char *error)
{
    struct jd_sched *s = w->s;
    jd_pid pid = (uint64_t)gen << 32 | p->index;
    /* release: later senders see Complete and get JD_ENOENT */
    atomic_store_explicit(&p->state, MKSTATE(gen, ST_COMPLETE), memory_order_release);
    BUMP(w, c_completions, 1);
    if (s->hooks.finished)
        s->hooks.finished(s->hooks.ctx, pid, p->user, status, result, error);
    if (p->ops->close)
        p->ops->close(p->self);
    free(p->method);
    free(p->input);
    free(p->tags);
    p->method = p->input = NULL;
    p->tags = NULL;
    p->ntags = p->tagcap = 0;
    struct jd_link *l = jd_mpsc_take_all(&p->events);
    while (l) {
        struct evnode *e = (struct evnode *)l;
        l = l->next;
        if (e->type != EV_KILL)
            count_stale(s, w);
        drop_event(s, w, e);
    }
    uint32_t ng = gen + 1 ? gen + 1 : 1;
    /* release: the slot's fields are reset before anyone can reuse it */
    atomic_store_explicit(&p->state, MKSTATE(ng, ST_FREE), memory_order_release);
    proc_release(s, w, p);
}

static void finish_killed(struct worker *w, struct proc *p, uint32_t gen, char *text)
{
    if (!text) {
        char *dummy = NULL;
        bool killed = false;
        size_t n = collect_events(w, p, gen, &dummy, &killed);
        free_event_payloads(w->evbuf, n);
        text = dummy;
    }
    finish(w, p, gen, JD_STEP_FAIL, NULL, text ? text : "{\"kind\":\"killed\"}");
    free(text);
}

static char *json_escape_error(const char *kind, const char *msg)
{
    size_t len = strlen(msg);
    char *esc = jd_xmalloc(len * 6 + 1), *o = esc;
    for (const unsigned char *c = (const unsigned char *)msg; *c; c++) {
        if (*c == '"' || *c == '\\') {
            *o++ = '\\';
            *o++ = (char)*c;
        } else if (*c < 0x20) {
            o += sprintf(o, "\\u%04x", *c);
        } else {
            *o++ = (char)*c;
        }
    }
    *o = 0;
    char *r = jd_xasprintf("{\"kind\":\"%s\",\"message\":\"%s\"}", kind, esc);
    free(esc);
    return r;
}

static void dispatch_yields(struct jd_sched *s, jd_pid pid, void *user, struct jd_step_out *out)
{
    for (size_t i = 0; i < out->nyields; i++) {
        struct jd_token tok = {.pid = pid, .tag = out->yields[i].tag};
        if (s->hooks.dispatch)
            s->hooks.dispatch(s->hooks.ctx, pid, user, &out->yields[i], tok);
        else
            jd_sched_complete(s, tok, NULL, jd_xstrdup("{\"kind\":\"no_dispatcher\"}"));
    }
}

/* sched_run(), once p is Running and ours. */
void sched_run_locked(struct worker *w, struct proc *p, uint64_t nw, uint32_t gen, jd_pid pid)
{
    struct jd_sched *s = w->s;
    uint64_t st;
    if (nw & F_KILL) {
        finish_killed(w, p, gen, NULL);
        return;
    }
    struct jd_step_out *out = &w->out;
    if (!p->inited) {
        p->inited = true;
        if (p->ops->init) {
            struct jd_error err;
            jd_error_clear(&err);
            int rc = p->ops->init(p->self, p->method, p->input, &err);
            if (rc) {
                char *e = json_escape_error("init_failed",
                                            err.message[0] ? err.message : jd_strerror(rc));
                finish(w, p, gen, JD_STEP_FAIL, NULL, e);
                free(e);
                return;
            }
        }
        free(p->method);
        free(p->input);
        p->method = p->input = NULL;
    }
    char *kill = NULL;
    bool killed = false;
    size_t n = collect_events(w, p, gen, &kill, &killed);
    if (killed) {
        finish_killed(w, p, gen, kill);
        return;
    }
    uint64_t seq = atomic_load_explicit(&w->stepseq, memory_order_relaxed);
    atomic_store_explicit(&w->stepseq, seq + 1, memory_order_relaxed);
    int rc = p->ops->step(p->self, w->evbuf, n, out);
    atomic_store_explicit(&w->stepseq, seq + 2, memory_order_relaxed);
    free_event_payloads(w->evbuf, n);
    BUMP(w, c_steps, 1);
    if (rc)
        jd_step_fail_take(out, jd_xasprintf("{\"kind\":\"step_error\",\"code\":%d}", rc));
    enum jd_step_status status = out->status;
    if (status == JD_STEP_DONE || status == JD_STEP_FAIL) {
        finish(w, p, gen, status, out->result, out->error);
        jd_step_out_reset(out);
        return;
    }
    if (s->hooks.stepped)
        s->hooks.stepped(s->hooks.ctx, pid, p->user, status);
    for (size_t i = 0; i < out->nyields; i++)
        add_tag(p, out->yields[i].tag);
    void *user = p->user;
    unsigned target = status == JD_STEP_CONTINUE ? ST_READY
                      : status == JD_STEP_WAIT   ? ST_BLOCKED
                                                 : ST_IDLE;
    st = nw;
    unsigned to;
    for (;;) {
        if (st & F_KILL) {
            jd_step_out_reset(out);
            finish_killed(w, p, gen, NULL);
            return;
        }
        to = (st & F_WAKEUP) ? ST_READY : target;
        /* seq_cst: the worker half of the wake-up Dekker pattern (the sender
         * pushes its event seq_cst, then CASes this word) */
        if (atomic_compare_exchange_weak_explicit(&p->state, &st,
                                                  (st & ~(uint64_t)(ST_MASK | F_WAKEUP)) | to,
                                                  memory_order_seq_cst, memory_order_relaxed))
            break;
    }
    if (to == ST_READY) {
        if (target == ST_READY)
            defer(w, p); /* a cooperative yield goes to the back */
        else
            push_top(w, p); /* woken while running: it has events to handle */
    } else if (jd_mpsc_nonempty(&p->events)) {
        /* Re-check after the move to Blocked/Idle. p may already be running
         * elsewhere or recycled: the CAS names the generation and state. */
        uint64_t exp = MKSTATE(gen, to);
        if (atomic_compare_exchange_strong_explicit(&p->state, &exp, MKSTATE(gen, ST_READY),
                                                    memory_order_seq_cst, memory_order_relaxed))
            push_top(w, p);
    }
    dispatch_yields(s, pid, user, out);
    jd_step_out_reset(out);
}
