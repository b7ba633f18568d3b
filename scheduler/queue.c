/*
 * Intrusive queues for the scheduler; see queue.h for roles and threading.
 */
#include "scheduler/queue.h"

void jd_lqueue_init(struct jd_lqueue *q)
{
    pthread_mutex_init(&q->mu, NULL);
    q->head = q->tail = NULL;
    atomic_init(&q->len, 0);
}

void jd_lqueue_destroy(struct jd_lqueue *q)
{
    pthread_mutex_destroy(&q->mu);
}

void jd_lqueue_push_chain(struct jd_lqueue *q, struct jd_link *first, struct jd_link *last,
                          size_t n)
{
    last->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = first;
    else
        q->head = first;
    q->tail = last;
    /* seq_cst: ordered before the pusher's read of the parked-worker counts */
    atomic_store_explicit(&q->len, atomic_load_explicit(&q->len, memory_order_relaxed) + n,
                          memory_order_seq_cst);
    pthread_mutex_unlock(&q->mu);
}

void jd_lqueue_push(struct jd_lqueue *q, struct jd_link *e)
{
    jd_lqueue_push_chain(q, e, e, 1);
}

size_t jd_lqueue_pop_batch(struct jd_lqueue *q, struct jd_link **out, size_t max)
{
    /* relaxed: an unlocked emptiness hint; a miss is caught by the parking re-check */
    if (atomic_load_explicit(&q->len, memory_order_relaxed) == 0)
        return 0;
    size_t n = 0;
    pthread_mutex_lock(&q->mu);
    while (n < max && q->head) {
        out[n++] = q->head;
        q->head = q->head->next;
    }
    if (!q->head)
        q->tail = NULL;
    atomic_store_explicit(&q->len, atomic_load_explicit(&q->len, memory_order_relaxed) - n,
                          memory_order_relaxed);
    pthread_mutex_unlock(&q->mu);
    return n;
}

size_t jd_lqueue_len(struct jd_lqueue *q)
{
    return atomic_load_explicit(&q->len, memory_order_seq_cst);
}

void jd_mpsc_init(struct jd_mpsc *m)
{
    atomic_init(&m->top, NULL);
}

void jd_mpsc_push(struct jd_mpsc *m, struct jd_link *e)
{
    struct jd_link *top = atomic_load_explicit(&m->top, memory_order_relaxed);
    do {
        e->next = top;
        /* release: the element's contents are visible to the consumer's acquire
         * exchange. seq_cst on success so the wake-up that follows (a state
         * CAS) cannot be ordered before the push. */
    } while (!atomic_compare_exchange_weak_explicit(&m->top, &top, e, memory_order_seq_cst,
                                                    memory_order_relaxed));
}

struct jd_link *jd_mpsc_take_all(struct jd_mpsc *m)
{
    if (!atomic_load_explicit(&m->top, memory_order_relaxed))
        return NULL;
    /* acquire: pairs with the producers' release pushes */
    struct jd_link *e = atomic_exchange_explicit(&m->top, NULL, memory_order_acquire);
    struct jd_link *rev = NULL;
    while (e) {
        struct jd_link *next = e->next;
        e->next = rev;
        rev = e;
        e = next;
    }
    return rev;
}

bool jd_mpsc_nonempty(struct jd_mpsc *m)
{
    return atomic_load_explicit(&m->top, memory_order_seq_cst) != NULL;
}
