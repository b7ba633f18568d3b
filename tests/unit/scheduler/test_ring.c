/*
 * Unit tests for scheduler/ring.c (the work-stealing ring) and
 * scheduler/queue.c (locked FIFO and MPSC event stack): ordering at both
 * ends, capacity and overflow, steal-half, and concurrent stealing with
 * every item taken exactly once. Single test thread except where noted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "scheduler/queue.h"
#include "scheduler/ring.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define ITEM(i) ((void *)(uintptr_t)((i) + 1))
#define NUM(p) ((uintptr_t)(p)-1)

static struct jd_ring *new_ring(void)
{
    struct jd_ring *r = aligned_alloc(64, sizeof(*r));
    jd_ring_init(r);
    return r;
}

static void test_push_pop_lifo(void **state)
{
    (void)state;
    struct jd_ring *r = new_ring();
    assert_null(jd_ring_pop(r));
    for (int i = 0; i < 10; i++)
        assert_true(jd_ring_push(r, ITEM(i)));
    assert_int_equal(jd_ring_len(r), 10);
    for (int i = 9; i >= 0; i--)
        assert_int_equal(NUM(jd_ring_pop(r)), i);
    assert_null(jd_ring_pop(r));
    assert_int_equal(jd_ring_len(r), 0);
    free(r);
}

static void test_push_back_and_pop_back(void **state)
{
    (void)state;
    struct jd_ring *r = new_ring();
    assert_true(jd_ring_push(r, ITEM(1)));
    assert_true(jd_ring_push_back(r, ITEM(0))); /* oldest */
    assert_true(jd_ring_push(r, ITEM(2)));      /* newest */
    assert_int_equal(NUM(jd_ring_pop_back(r)), 0);
    assert_int_equal(NUM(jd_ring_pop(r)), 2);
    assert_int_equal(NUM(jd_ring_pop_back(r)), 1);
    assert_null(jd_ring_pop_back(r));
    free(r);
}

static void test_push_back_many(void **state)
{
    (void)state;
    struct jd_ring *r = new_ring();
    void *items[300];
    for (int i = 0; i < 300; i++)
        items[i] = ITEM(i);
    assert_true(jd_ring_push(r, ITEM(1000)));
    /* like repeated push_back: items[0] nearest the owner's end */
    assert_int_equal(jd_ring_push_back_many(r, items, 3), 3);
    assert_int_equal(NUM(jd_ring_pop(r)), 1000);
    assert_int_equal(NUM(jd_ring_pop(r)), 0);
    assert_int_equal(NUM(jd_ring_pop_back(r)), 2);
    assert_int_equal(NUM(jd_ring_pop(r)), 1);
    assert_null(jd_ring_pop(r));
    /* only what fits */
    assert_int_equal(jd_ring_push_back_many(r, items, 300), JD_RING_SIZE);
    assert_int_equal(jd_ring_push_back_many(r, items, 1), 0);
    assert_int_equal(NUM(jd_ring_pop(r)), 0);
    assert_int_equal(NUM(jd_ring_pop_back(r)), JD_RING_SIZE - 1);
    free(r);
}

static void test_full_and_wraparound(void **state)
{
    (void)state;
    struct jd_ring *r = new_ring();
    /* many rounds so the 16-bit indices wrap */
    for (int round = 0; round < 600; round++) {
        for (int i = 0; i < JD_RING_SIZE; i++)
            assert_true(jd_ring_push(r, ITEM(i)));
        assert_false(jd_ring_push(r, ITEM(999)));
        assert_false(jd_ring_push_back(r, ITEM(999)));
        for (int i = 0; i < JD_RING_SIZE; i++)
            assert_int_equal(NUM(jd_ring_pop_back(r)), i);
        assert_null(jd_ring_pop(r));
    }
    free(r);
}

static void test_take_half_overflow(void **state)
{
    (void)state;
    struct jd_ring *r = new_ring();
    for (int i = 0; i < JD_RING_SIZE; i++)
        assert_true(jd_ring_push(r, ITEM(i)));
    void *out[JD_RING_SIZE / 2];
    size_t n = jd_ring_take_half(r, out);
    assert_int_equal(n, JD_RING_SIZE / 2);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(NUM(out[i]), i); /* the oldest half, oldest first */
    assert_int_equal(jd_ring_len(r), JD_RING_SIZE / 2);
    assert_true(jd_ring_push(r, ITEM(1000)));
    assert_int_equal(NUM(jd_ring_pop(r)), 1000);
    assert_int_equal(NUM(jd_ring_pop(r)), JD_RING_SIZE - 1);
    free(r);
}

static void test_steal_half(void **state)
{
    (void)state;
    struct jd_ring *v = new_ring(), *d = new_ring();
    assert_null(jd_ring_steal_half(v, d, NULL));
    for (int i = 0; i < 9; i++)
        assert_true(jd_ring_push(v, ITEM(i)));
    size_t moved = 0;
    void *first = jd_ring_steal_half(v, d, &moved);
    assert_int_equal(moved, 5);      /* half, rounded up */
    assert_int_equal(NUM(first), 0); /* thieves take the oldest */
    assert_int_equal(jd_ring_len(d), 4);
    assert_int_equal(jd_ring_len(v), 4);
    assert_int_equal(NUM(jd_ring_pop_back(d)), 1);
    assert_int_equal(NUM(jd_ring_pop(d)), 4);
    assert_int_equal(NUM(jd_ring_pop(v)), 8);
    assert_int_equal(NUM(jd_ring_pop_back(v)), 5);
    /* a single item can be stolen */
    jd_ring_pop(d);
    jd_ring_pop(d);
    jd_ring_pop(v);
    jd_ring_pop(v);
    assert_true(jd_ring_push(v, ITEM(77)));
    assert_int_equal(NUM(jd_ring_steal_half(v, d, &moved)), 77);
    assert_int_equal(moved, 1);
    assert_null(jd_ring_pop(v));
    free(v);
    free(d);
}

/* Concurrent: the owner pushes and pops, two thieves steal; every item is
 * taken exactly once. */
#define CONC_ITEMS 200000
static _Atomic unsigned char seen[CONC_ITEMS];
static _Atomic int done_pushing;
static struct jd_ring *conc_ring;

static void mark(void *p)
{
    unsigned char prev = atomic_fetch_add(&seen[NUM(p)], 1);
    assert_int_equal(prev, 0);
}

static void *thief(void *arg)
{
    (void)arg;
    struct jd_ring *mine = new_ring();
    for (;;) {
        void *p = jd_ring_steal_half(conc_ring, mine, NULL);
        if (p) {
            mark(p);
            while ((p = jd_ring_pop(mine)))
                mark(p);
        } else if (atomic_load(&done_pushing) && jd_ring_len(conc_ring) == 0) {
            break;
        }
    }
    free(mine);
    return NULL;
}

static void test_concurrent_steal_exactly_once(void **state)
{
    (void)state;
    conc_ring = new_ring();
    memset((void *)seen, 0, sizeof(seen));
    atomic_store(&done_pushing, 0);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, thief, NULL);
    for (int i = 0; i < CONC_ITEMS; i++) {
        while (!jd_ring_push(conc_ring, ITEM(i))) {
            void *p = jd_ring_pop(conc_ring);
            if (p)
                mark(p);
        }
        if (i % 3 == 0) {
            void *p = (i % 2) ? jd_ring_pop(conc_ring) : jd_ring_pop_back(conc_ring);
            if (p)
                mark(p);
        }
    }
    void *p;
    while ((p = jd_ring_pop(conc_ring)))
        mark(p);
    atomic_store(&done_pushing, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < CONC_ITEMS; i++)
        assert_int_equal(atomic_load(&seen[i]), 1);
    free(conc_ring);
}

struct qitem {
    struct jd_link link;
    int v;
};

static void test_lqueue_fifo_batches(void **state)
{
    (void)state;
    struct jd_lqueue q;
    jd_lqueue_init(&q, 16);
    struct qitem it[40];
    for (int i = 0; i < 40; i++) {
        it[i].v = i;
        jd_lqueue_push(&q, &it[i].link);
    }
    assert_int_equal(jd_lqueue_len(&q), 40);
    struct jd_link *out[17];
    int expect = 0;
    size_t n;
    while ((n = jd_lqueue_pop_batch(&q, out, 17)) > 0) {
        assert_true(n <= 17);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(((struct qitem *)out[i])->v, expect++);
    }
    assert_int_equal(expect, 40);
    assert_int_equal(jd_lqueue_len(&q), 0);
    /* chains keep their order */
    for (int i = 0; i < 3; i++)
        it[i].link.next = &it[i + 1].link;
    jd_lqueue_push(&q, &it[10].link);
    jd_lqueue_push_chain(&q, &it[0].link, &it[3].link, 4);
    assert_int_equal(jd_lqueue_pop_batch(&q, out, 17), 5);
    assert_int_equal(((struct qitem *)out[0])->v, 10);
    assert_int_equal(((struct qitem *)out[4])->v, 3);
    jd_lqueue_destroy(&q);
}

/* A pop stops at a cell a producer has claimed but not yet filled, and
 * then leaves the overflow alone too: what overflowed was pushed after
 * that cell was claimed, so taking it first could reorder a producer. */
static void test_lqueue_stops_at_unpublished_cell(void **state)
{
    (void)state;
    struct jd_lqueue q;
    jd_lqueue_init(&q, 4);
    struct qitem it[5];
    for (int i = 0; i < 5; i++)
        it[i].v = i;
    jd_lqueue_push(&q, &it[0].link);
    /* a producer claims cell 1 and is preempted before filling it */
    uint64_t claimed = atomic_fetch_add(&q.enq, 1);
    assert_int_equal(claimed, 1);
    jd_lqueue_push(&q, &it[2].link);
    jd_lqueue_push(&q, &it[3].link);
    jd_lqueue_push(&q, &it[4].link); /* the array is full: the overflow */
    assert_int_equal(jd_lqueue_len(&q), 4);
    struct jd_link *out[8];
    assert_int_equal(jd_lqueue_pop_batch(&q, out, 8), 1);
    assert_ptr_equal(out[0], &it[0].link);
    assert_int_equal(jd_lqueue_pop_batch(&q, out, 8), 0);
    /* the producer resumes: fills and publishes its cell */
    q.cells[claimed & q.mask].item = &it[1].link;
    atomic_store(&q.cells[claimed & q.mask].seq, claimed + 1);
    atomic_fetch_add(&q.len, 1);
    assert_int_equal(jd_lqueue_pop_batch(&q, out, 8), 4);
    for (int i = 0; i < 4; i++)
        assert_ptr_equal(out[i], &it[i + 1].link);
    assert_int_equal(jd_lqueue_len(&q), 0);
    /* the overflow drained: pushes use the array again */
    jd_lqueue_push(&q, &it[0].link);
    assert_int_equal(atomic_load(&q.nover), 0);
    assert_int_equal(atomic_load(&q.enq), 5);
    assert_int_equal(jd_lqueue_pop_batch(&q, out, 8), 1);
    jd_lqueue_destroy(&q);
}

/* Producers push singly (lock-free) and in chains (locked) while the test
 * thread pops batches: each element once, each producer's order kept. */
#define LQ_PRODUCERS 3
#define LQ_PER 30000
static struct jd_lqueue lq;

static void *lq_producer(void *arg)
{
    int id = (int)(intptr_t)arg;
    struct qitem *items = calloc(LQ_PER, sizeof(*items));
    for (int i = 0; i < LQ_PER; i++)
        items[i].v = id * LQ_PER + i;
    for (int i = 0; i < LQ_PER;) {
        if (i % 10 == 0 && i + 4 <= LQ_PER) {
            for (int k = 0; k < 3; k++)
                items[i + k].link.next = &items[i + k + 1].link;
            jd_lqueue_push_chain(&lq, &items[i].link, &items[i + 3].link, 4);
            i += 4;
        } else {
            jd_lqueue_push(&lq, &items[i].link);
            i++;
        }
    }
    return items;
}

static void test_lqueue_concurrent_fifo(void **state)
{
    (void)state;
    jd_lqueue_init(&lq, 64);
    pthread_t t[LQ_PRODUCERS];
    for (int i = 0; i < LQ_PRODUCERS; i++)
        pthread_create(&t[i], NULL, lq_producer, (void *)(intptr_t)i);
    int last[LQ_PRODUCERS] = {-1, -1, -1};
    int got = 0;
    struct jd_link *out[17];
    while (got < LQ_PRODUCERS * LQ_PER) {
        size_t n = jd_lqueue_pop_batch(&lq, out, 17);
        for (size_t i = 0; i < n; i++) {
            int v = ((struct qitem *)out[i])->v;
            int p = v / LQ_PER;
            assert_int_equal(v % LQ_PER, last[p] + 1);
            last[p] = v % LQ_PER;
            got++;
        }
    }
    for (int i = 0; i < LQ_PRODUCERS; i++) {
        void *items;
        pthread_join(t[i], &items);
        free(items);
    }
    assert_int_equal(jd_lqueue_len(&lq), 0);
    jd_lqueue_destroy(&lq);
}

#define MPSC_PRODUCERS 3
#define MPSC_PER 20000
static struct jd_mpsc mq;

static void *mpsc_producer(void *arg)
{
    int id = (int)(intptr_t)arg;
    struct qitem *items = calloc(MPSC_PER, sizeof(*items));
    for (int i = 0; i < MPSC_PER; i++) {
        items[i].v = id * MPSC_PER + i;
        jd_mpsc_push(&mq, &items[i].link);
    }
    return items;
}

static void test_mpsc_order_and_concurrency(void **state)
{
    (void)state;
    jd_mpsc_init(&mq);
    assert_null(jd_mpsc_take_all(&mq));
    struct qitem a = {.v = 1}, b = {.v = 2}, c = {.v = 3};
    jd_mpsc_push(&mq, &a.link);
    jd_mpsc_push(&mq, &b.link);
    jd_mpsc_push(&mq, &c.link);
    assert_true(jd_mpsc_nonempty(&mq));
    struct jd_link *l = jd_mpsc_take_all(&mq);
    assert_ptr_equal(l, &a.link); /* arrival order */
    assert_ptr_equal(l->next, &b.link);
    assert_ptr_equal(l->next->next, &c.link);
    assert_null(l->next->next->next);
    assert_false(jd_mpsc_nonempty(&mq));

    pthread_t t[MPSC_PRODUCERS];
    for (int i = 0; i < MPSC_PRODUCERS; i++)
        pthread_create(&t[i], NULL, mpsc_producer, (void *)(intptr_t)i);
    int last[MPSC_PRODUCERS];
    for (int i = 0; i < MPSC_PRODUCERS; i++)
        last[i] = -1;
    int got = 0;
    while (got < MPSC_PRODUCERS * MPSC_PER) {
        for (l = jd_mpsc_take_all(&mq); l; l = l->next) {
            int v = ((struct qitem *)l)->v;
            int p = v / MPSC_PER;
            assert_true(v % MPSC_PER > last[p]); /* per-producer FIFO */
            last[p] = v % MPSC_PER;
            got++;
        }
    }
    for (int i = 0; i < MPSC_PRODUCERS; i++) {
        void *items;
        pthread_join(t[i], &items);
        free(items);
    }
    assert_int_equal(got, MPSC_PRODUCERS * MPSC_PER);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_pop_lifo),
        cmocka_unit_test(test_push_back_and_pop_back),
        cmocka_unit_test(test_push_back_many),
        cmocka_unit_test(test_full_and_wraparound),
        cmocka_unit_test(test_take_half_overflow),
        cmocka_unit_test(test_steal_half),
        cmocka_unit_test(test_concurrent_steal_exactly_once),
        cmocka_unit_test(test_lqueue_fifo_batches),
        cmocka_unit_test(test_lqueue_stops_at_unpublished_cell),
        cmocka_unit_test(test_lqueue_concurrent_fifo),
        cmocka_unit_test(test_mpsc_order_and_concurrency),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
