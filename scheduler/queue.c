/*
 * Intrusive queues for the scheduler; see queue.h for roles and threading.
 */
#include "scheduler/queue.h"

#include "common/alloc.h"

#include <stdlib.h>

void jd_lqueue_init(struct jd_lqueue *q, size_t cells)
{
    pthread_mutex_init(&q->mu, NULL);
    q->deq = 0;
    q->head = q->tail = NULL;
    atomic_init(&q->arrivals, NULL);
    atomic_init(&q->nover, 0);
    atomic_init(&q->len, 0);
    atomic_init(&q->enq, 0);
    /* 16-byte cells from calloc never straddle a cache line */
    q->cells = jd_xcalloc(cells, sizeof(*q->cells));
    q->mask = cells - 1;
    for (uint64_t i = 0; i < cells; i++) {
        atomic_init(&q->cells[i].seq, i);
        q->cells[i].item = NULL;
    }
}

void jd_lqueue_destroy(struct jd_lqueue *q)
{
    pthread_mutex_destroy(&q->mu);
    free(q->cells);
    q->cells = NULL;
}

/* Claim and fill the next cell; false when the array is full. */
static bool cells_push(struct jd_lqueue *q, struct jd_link *e)
{
    uint64_t pos = atomic_load_explicit(&q->enq, memory_order_relaxed);
    for (;;) {
        struct jd_lqueue_cell *c = &q->cells[pos & q->mask];
        /* acquire: the pop that freed the cell is done with its item */
        uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
        int64_t diff = (int64_t)(seq - pos);
        if (diff == 0) {
            /* relaxed: the cell's seq, not enq, orders the item */
            if (atomic_compare_exchange_weak_explicit(&q->enq, &pos, pos + 1, memory_order_relaxed,
                                                      memory_order_relaxed)) {
                c->item = e;
                /* release: the item is visible to the pop that acquires seq */
                atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
                return true;
            }
        } else if (diff < 0) {
            return false; /* the cell still holds an item one lap behind: full */
        } else {
            pos = atomic_load_explicit(&q->enq, memory_order_relaxed);
        }
    }
}

/* Under mu: pop up to max published cells in order into out. *blocked is
 * set when the pop stopped at a claimed cell not yet published. */
static size_t cells_pop(struct jd_lqueue *q, struct jd_link **out, size_t max, bool *blocked)
{
    size_t n = 0;
    uint64_t pos = q->deq;
    while (n < max) {
        struct jd_lqueue_cell *c = &q->cells[pos & q->mask];
        /* acquire: pairs with the pusher's release store (the item) */
        if (atomic_load_explicit(&c->seq, memory_order_acquire) != pos + 1)
            break;
        out[n++] = c->item;
        /* release: our read of the item is done before a pusher refills it */
        atomic_store_explicit(&c->seq, pos + q->mask + 1, memory_order_release);
        pos++;
    }
    q->deq = pos;
    *blocked = n < max && atomic_load_explicit(&q->enq, memory_order_relaxed) != pos;
    return n;
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
    atomic_fetch_add_explicit(&q->nover, (long)n, memory_order_relaxed);
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
    /* relaxed: nover is a hint; while the overflow holds anything, newer
     * elements go there too (see pop for why that keeps each producer's
     * order) */
    if (atomic_load_explicit(&q->nover, memory_order_relaxed) != 0 || !cells_push(q, e)) {
        atomic_fetch_add_explicit(&q->nover, 1, memory_order_relaxed);
        struct jd_link *top = atomic_load_explicit(&q->arrivals, memory_order_relaxed);
        do {
            e->next = top;
            /* release: the element is complete before a consumer can take it */
        } while (!atomic_compare_exchange_weak_explicit(&q->arrivals, &top, e, memory_order_release,
                                                        memory_order_relaxed));
    }
    /* seq_cst: ordered before the pusher's read of the parked-worker counts */
    atomic_fetch_add_explicit(&q->len, 1, memory_order_seq_cst);
}

size_t jd_lqueue_pop_batch(struct jd_lqueue *q, struct jd_link **out, size_t max)
{
    /* relaxed: an unlocked emptiness hint; a miss is caught by the parking re-check */
    if (atomic_load_explicit(&q->len, memory_order_relaxed) <= 0)
        return 0;
    pthread_mutex_lock(&q->mu);
    bool blocked;
    size_t n = cells_pop(q, out, max, &blocked);
    /* The overflow holds only elements pushed after every cell a producer
     * had claimed when it overflowed; while a cell is claimed but not yet
     * published, taking the overflow could pass that producer's older one. */
    if (n < max && !blocked && atomic_load_explicit(&q->nover, memory_order_relaxed) > 0) {
        size_t k = 0;
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
            k++;
        }
        atomic_fetch_sub_explicit(&q->nover, (long)k, memory_order_relaxed);
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
