/*
 * The per-worker run ring: a fixed 256-slot work-stealing deque of pointers.
 *
 * One 64-bit word holds three 16-bit indices (wrapping): `steal` (first slot
 * a thief may still be copying), `head` (first slot not yet claimed by a
 * thief), `tail` (one past the newest item). Invariant: steal <= head <= tail
 * and tail - steal <= JD_RING_SIZE (mod 2^16). Thieves claim half of
 * [head, tail) with one CAS (head += n, steal stays), copy the claimed slots,
 * then release them with a second CAS (steal = head): Tokio's two-phase
 * steal, so a thief reads slots only after it owns them and no ABA on the
 * word can hand it a stale item. Unlike Tokio the owner also pops from the
 * tail (LIFO), with a CAS that fails if a thief moved head past the slot.
 *
 * Threading: jd_ring_push/push_back/pop/pop_back/take_half are owner-only;
 * jd_ring_steal_half is called by any other thread with the thief's own ring
 * as destination; jd_ring_len from anywhere (a snapshot).
 * Ordering: the owner publishes a slot with a release RMW on the word;
 * thieves acquire the word before reading claimed slots; the thief's release
 * of `steal` is a release CAS, which the owner acquires before reusing slots.
 * Every access is an atomic operation (no standalone fences), so
 * ThreadSanitizer models it exactly.
 */
#ifndef JD_SCHEDULER_RING_H
#define JD_SCHEDULER_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JD_RING_SIZE 256 /* as Go and Tokio: fits L1, overflow goes to the global queue */

struct jd_ring {
    _Alignas(64) _Atomic uint64_t word; /* steal | head << 16 | tail << 48 */
    _Alignas(64) _Atomic(void *) slot[JD_RING_SIZE];
};

void jd_ring_init(struct jd_ring *r);

/* Items in [head, tail) right now (any thread; a snapshot). */
size_t jd_ring_len(struct jd_ring *r);

/* Owner: push at the tail (the LIFO end). false when full. */
bool jd_ring_push(struct jd_ring *r, void *item);

/* Owner: push at the head (the FIFO end, popped last by the owner, stolen
 * first). false when full or while a steal is in progress. */
bool jd_ring_push_back(struct jd_ring *r, void *item);

/* Owner: push up to n items at the head, items[0] nearest the owner's end
 * (as n calls of jd_ring_push_back). Returns how many fitted (0 while a
 * steal is in progress). One CAS for the lot. */
size_t jd_ring_push_back_many(struct jd_ring *r, void *const *items, size_t n);

/* Owner: pop the newest item, or NULL. */
void *jd_ring_pop(struct jd_ring *r);

/* Owner: pop the oldest item, or NULL (fairness: lets old work run). */
void *jd_ring_pop_back(struct jd_ring *r);

/* Owner, on overflow: claim the oldest JD_RING_SIZE/2 items into out (room
 * for JD_RING_SIZE/2), oldest first. Returns how many (0 while a thief is
 * copying: the caller then overflows just its one item). */
size_t jd_ring_take_half(struct jd_ring *r, void **out);

/*
 * Thief: claim half (rounded up) of victim's items with one CAS, move all but
 * one of them into dst (the thief's own ring, which must have room: the
 * count is capped at dst's free space + 1) and return that one, or NULL when
 * the victim is empty or another thief is busy with it. *moved (may be NULL)
 * receives how many items were claimed.
 */
void *jd_ring_steal_half(struct jd_ring *victim, struct jd_ring *dst, size_t *moved);

#endif
