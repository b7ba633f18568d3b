/*
 * The work-stealing ring; see ring.h for the protocol, its invariants and
 * which thread may call what.
 */
#include "scheduler/ring.h"

#define MASK (JD_RING_SIZE - 1)

static inline uint16_t f_steal(uint64_t w)
{
    return (uint16_t)w;
}

static inline uint16_t f_head(uint64_t w)
{
    return (uint16_t)(w >> 16);
}

static inline uint16_t f_tail(uint64_t w)
{
    return (uint16_t)(w >> 48);
}

static inline uint64_t pack(uint16_t s, uint16_t h, uint16_t t)
{
    return (uint64_t)s | (uint64_t)h << 16 | (uint64_t)t << 48;
}

void jd_ring_init(struct jd_ring *r)
{
    atomic_init(&r->word, 0);
    for (size_t i = 0; i < JD_RING_SIZE; i++)
        atomic_init(&r->slot[i], NULL);
}

size_t jd_ring_len(struct jd_ring *r)
{
    /* relaxed: a snapshot for heuristics and statistics only */
    uint64_t w = atomic_load_explicit(&r->word, memory_order_relaxed);
    return (uint16_t)(f_tail(w) - f_head(w));
}

bool jd_ring_push(struct jd_ring *r, void *item)
{
    /* acquire: a thief's release of `steal` must happen before we reuse its slots */
    uint64_t w = atomic_load_explicit(&r->word, memory_order_acquire);
    uint16_t t = f_tail(w);
    if ((uint16_t)(t - f_steal(w)) >= JD_RING_SIZE)
        return false;
    atomic_store_explicit(&r->slot[t & MASK], item, memory_order_relaxed);
    /* release: publishes the slot to thieves that acquire the word. Only the
     * owner changes tail, and adding 1 << 48 never carries into the other
     * fields (the carry out of bit 63 is the 16-bit wrap). */
    atomic_fetch_add_explicit(&r->word, (uint64_t)1 << 48, memory_order_release);
    return true;
}

bool jd_ring_push_back(struct jd_ring *r, void *item)
{
    uint64_t w = atomic_load_explicit(&r->word, memory_order_acquire);
    for (;;) {
        uint16_t s = f_steal(w), h = f_head(w), t = f_tail(w);
        if (s != h || (uint16_t)(t - s) >= JD_RING_SIZE)
            return false;
        uint16_t nh = (uint16_t)(h - 1);
        /* The slot below head is free (tail - steal < size) and no thief
         * reads it: thieves read only slots they claimed from [head, tail). */
        atomic_store_explicit(&r->slot[nh & MASK], item, memory_order_relaxed);
        /* release: publishes the slot; fails if a thief claimed meanwhile */
        if (atomic_compare_exchange_weak_explicit(&r->word, &w, pack(nh, nh, t),
                                                  memory_order_acq_rel, memory_order_acquire))
            return true;
    }
}

size_t jd_ring_push_back_many(struct jd_ring *r, void *const *items, size_t n)
{
    uint64_t w = atomic_load_explicit(&r->word, memory_order_acquire);
    for (;;) {
        uint16_t s = f_steal(w), h = f_head(w), t = f_tail(w);
        size_t room = JD_RING_SIZE - (uint16_t)(t - s);
        if (s != h || room == 0)
            return 0;
        size_t k = n < room ? n : room;
        for (size_t i = 0; i < k; i++)
            atomic_store_explicit(&r->slot[(uint16_t)(h - 1 - i) & MASK], items[i],
                                  memory_order_relaxed);
        uint16_t nh = (uint16_t)(h - k);
        /* release: publishes the slots; fails if a thief claimed meanwhile */
        if (atomic_compare_exchange_weak_explicit(&r->word, &w, pack(nh, nh, t),
                                                  memory_order_acq_rel, memory_order_acquire))
            return k;
    }
}

void *jd_ring_pop(struct jd_ring *r)
{
    uint64_t w = atomic_load_explicit(&r->word, memory_order_acquire);
    for (;;) {
        uint16_t s = f_steal(w), h = f_head(w), t = f_tail(w);
        if (h == t)
            return NULL;
        uint16_t nt = (uint16_t)(t - 1);
        /* acq_rel: fails if a thief claimed the slot (moved head) meanwhile */
        if (atomic_compare_exchange_weak_explicit(&r->word, &w, pack(s, h, nt),
                                                  memory_order_acq_rel, memory_order_acquire))
            return atomic_load_explicit(&r->slot[nt & MASK], memory_order_relaxed);
    }
}

void *jd_ring_pop_back(struct jd_ring *r)
{
    uint64_t w = atomic_load_explicit(&r->word, memory_order_acquire);
    for (;;) {
        uint16_t s = f_steal(w), h = f_head(w), t = f_tail(w);
        if (h == t)
            return NULL;
        uint16_t nh = (uint16_t)(h + 1);
        /* While a thief copies [steal, head) only head moves; else both. */
        uint64_t nw = s == h ? pack(nh, nh, t) : pack(s, nh, t);
        if (atomic_compare_exchange_weak_explicit(&r->word, &w, nw, memory_order_acq_rel,
                                                  memory_order_acquire))
            return atomic_load_explicit(&r->slot[h & MASK], memory_order_relaxed);
    }
}

size_t jd_ring_take_half(struct jd_ring *r, void **out)
{
    uint64_t w = atomic_load_explicit(&r->word, memory_order_acquire);
    for (;;) {
        uint16_t s = f_steal(w), h = f_head(w), t = f_tail(w);
        if (s != h)
            return 0;
        uint16_t n = (uint16_t)(t - h) / 2;
        if (n > JD_RING_SIZE / 2)
            n = JD_RING_SIZE / 2;
        if (n == 0)
            return 0;
        uint16_t nh = (uint16_t)(h + n);
        if (atomic_compare_exchange_weak_explicit(&r->word, &w, pack(nh, nh, t),
                                                  memory_order_acq_rel, memory_order_acquire)) {
            for (uint16_t i = 0; i < n; i++)
                out[i] =
                    atomic_load_explicit(&r->slot[(uint16_t)(h + i) & MASK], memory_order_relaxed);
            return n;
        }
    }
}

void *jd_ring_steal_half(struct jd_ring *victim, struct jd_ring *dst, size_t *moved)
{
    if (moved)
        *moved = 0;
    /* acquire: pairs with the owner's release push, so claimed slots are visible */
    uint64_t w = atomic_load_explicit(&victim->word, memory_order_acquire);
    uint64_t dw = atomic_load_explicit(&dst->word, memory_order_acquire);
    size_t room = JD_RING_SIZE - (uint16_t)(f_tail(dw) - f_steal(dw));
    uint16_t s, h, n;
    for (;;) {
        s = f_steal(w);
        h = f_head(w);
        uint16_t t = f_tail(w);
        if (s != h)
            return NULL; /* another thief is copying: try elsewhere */
        uint16_t avail = (uint16_t)(t - h);
        if (avail == 0 || avail > JD_RING_SIZE)
            return NULL;
        n = (uint16_t)(avail - avail / 2);
        if (n > room + 1)
            n = (uint16_t)(room + 1);
        /* acq_rel: the claim; after it the owner can neither pop nor overwrite
         * [h, h + n) until we release `steal` */
        if (atomic_compare_exchange_weak_explicit(&victim->word, &w, pack(s, (uint16_t)(h + n), t),
                                                  memory_order_acq_rel, memory_order_acquire))
            break;
    }
    void *first = atomic_load_explicit(&victim->slot[h & MASK], memory_order_relaxed);
    uint16_t dt = f_tail(dw);
    for (uint16_t i = 1; i < n; i++) {
        void *it =
            atomic_load_explicit(&victim->slot[(uint16_t)(h + i) & MASK], memory_order_relaxed);
        atomic_store_explicit(&dst->slot[(uint16_t)(dt + i - 1) & MASK], it, memory_order_relaxed);
    }
    /* Release the claimed slots: steal catches up with head (which the owner
     * may have moved further by pop_back meanwhile; tail may have changed).
     * release: our slot reads happen before the owner reuses them. */
    w = atomic_load_explicit(&victim->word, memory_order_acquire);
    for (;;) {
        uint64_t nw = pack(f_head(w), f_head(w), f_tail(w));
        if (atomic_compare_exchange_weak_explicit(&victim->word, &w, nw, memory_order_acq_rel,
                                                  memory_order_acquire))
            break;
    }
    if (n > 1)
        /* release: publish the copied slots of our own ring to its thieves */
        atomic_fetch_add_explicit(&dst->word, (uint64_t)(n - 1) << 48, memory_order_release);
    if (moved)
        *moved = n;
    return first;
}
