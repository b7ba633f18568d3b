/*
 * Intrusive queues for the scheduler; see queue.h for roles and threading.
 */
#include "scheduler/queue.h"

void jd_lqueue_init(struct jd_lqueue *q)
{
    pthread_mutex_init(&q->mu, NULL);
    q->head = q->tail = NULL;
    atomic_init(&q->arrivals, NULL);
    atomic_init(&q->len, 0);
}

void jd_lqueue_destroy(struct jd_lqueue *q)
{
    pthread_mutex_destroy(&q->mu);
}

/* Under mu: move the lock-free arrivals, oldest first, to the list's tail. */
static void absorb_arrivals(struct jd_lqueue *q)
{
    if (!atomic_load_explicit(&q->arrivals, memory_order_relaxed))
        return;
    /* acquire: pairs with the pushers' release CAS (element contents) */
    struct jd_link *e = atomic_exchange_explicit(&q->arrivals, NULL, memory_order_acquire);
    struct jd_link *first = NULL, *last = e;
    while (e) {
        struct jd_link *next = e->next;
        e->next = first;
        first = e;
        e = next;
    }
    if (!first)
        return;
    if (q->tail)
        q->tail->next = first;
    else
        q->head = first;
    q->tail = last;
}

void jd_lqueue_push_chain(struct jd_lqueue *q, struct jd_link *first, struct jd_link *last,
                          size_t n)
{
    last->next = NULL;
    pthread_mutex_lock(&q->mu);
    absorb_arrivals(q); /* older single pushes stay ahead of the chain */
    if (q->tail)
        q->tail->next = first;
    else
        q->head = first;
    q->tail = last;
    pthread_mutex_unlock(&q->mu);
    /* seq_cst: ordered before the pusher's read of the parked-worker counts */
    atomic_fetch_add_explicit(&q->len, (long)n, memory_order_seq_cst);
}

void jd_lqueue_push(struct jd_lqueue *q, struct jd_link *e)
{
    struct jd_link *top = atomic_load_explicit(&q->arrivals, memory_order_relaxed);
    do {
        e->next = top;
        /* release: the element is complete before a consumer can take it */
    } while (!atomic_compare_exchange_weak_explicit(&q->arrivals, &top, e, memory_order_release,
                                                    memory_order_relaxed));
    /* seq_cst: ordered before the pusher's read of the parked-worker counts */
    atomic_fetch_add_explicit(&q->len, 1, memory_order_seq_cst);
}

size_t jd_lqueue_pop_batch(struct jd_lqueue *q, struct jd_link **out, size_t max)
{
    /* relaxed: an unlocked emptiness hint; a miss is caught by the parking re-check */
    if (atomic_load_explicit(&q->len, memory_order_relaxed) <= 0)
        return 0;
    size_t n = 0;
    pthread_mutex_lock(&q->mu);
    if (!q->head)
        absorb_arrivals(q);
    while (n < max) {
        if (!q->head) {
            absorb_arrivals(q);
            if (!q->head)
                break;
        }
        out[n++] = q->head;
        q->head = q->head->next;
        if (!q->head)
            q->tail = NULL;
    }
    pthread_mutex_unlock(&q->mu);
    if (n)
        atomic_fetch_sub_explicit(&q->len, (long)n, memory_order_relaxed);
    return n;
}

size_t jd_lqueue_len(struct jd_lqueue *q)
{
    long n = atomic_load_explicit(&q->len, memory_order_seq_cst);
    return n > 0 ? (size_t)n : 0;
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
