/*
 * Stress (meant for ThreadSanitizer): thousands of concurrent plugin calls
 * completing from many threads while per-attempt timeouts fire, retries back
 * off, a canceller thread cancels calls and the plugin completes some calls
 * twice. Checks that every call's done() fires exactly once, that the
 * registry's counters add up, and that nothing is lost (every call ends).
 *
 * Default: 50 000 calls (about 3 s under TSan); JD_STRESS=long: 300 000.
 * Threads: the test thread submits, 4 completer threads finish calls, one
 * canceller thread cancels, the env's timer thread fires deadlines/retries.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/error.h"
#include "plugins/registry.h"
#include "tests/unit/plugins/plugin_env.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define COMPLETERS 4
#define MAX_IN_FLIGHT 1000 /* bounds the env's (linear) timer list */

static const struct jd_host *host;

/* The plugin's queue of calls waiting for a completer. */
static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;
static struct jd_call **q;
static size_t q_len, q_cap;
static bool q_stop;
static _Atomic uint64_t hook_cancels; /* relaxed: a statistic */

static void racer_handle(const struct jd_call_info *info)
{
    pthread_mutex_lock(&q_mu);
    if (q_len == q_cap) {
        q_cap = q_cap ? q_cap * 2 : 1024;
        q = realloc(q, q_cap * sizeof *q);
    }
    q[q_len++] = info->call;
    pthread_cond_signal(&q_cond);
    pthread_mutex_unlock(&q_mu);
}

static void racer_cancel(struct jd_call *call)
{
    (void)call; /* the completer will release it (and get ESTALE) */
    atomic_fetch_add_explicit(&hook_cancels, 1, memory_order_relaxed);
}

static const struct jd_command racer_cmds[] = {
    {.name = "racer", .handle = racer_handle, .cancel = racer_cancel},
};
static const struct jd_plugin racer_plugin = {
    .abi_version = JD_PLUGIN_ABI_VERSION,
    .name = "racer",
    .version = "1",
    .commands = racer_cmds,
    .ncommands = 1,
};

static const struct jd_plugin *racer_entry(const struct jd_host *h)
{
    host = h;
    return &racer_plugin;
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void *completer(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ULL + 1;
    for (;;) {
        struct jd_call *c;
        pthread_mutex_lock(&q_mu);
        while (!q_len && !q_stop)
            pthread_cond_wait(&q_cond, &q_mu);
        if (!q_len) {
            pthread_mutex_unlock(&q_mu);
            return NULL;
        }
        /* Take a random one, so completion order differs from dispatch. */
        size_t i = xorshift(&seed) % q_len;
        c = q[i];
        q[i] = q[--q_len];
        pthread_mutex_unlock(&q_mu);
        uint64_t r = xorshift(&seed) % 100;
        if (r < 3)
            usleep(1000 + (unsigned)(r * 300)); /* slow: let the deadline win */
        else if (r < 20)
            sched_yield();
        if (r < 65) {
            host->complete(c, "{\"ok\":true}");
        } else if (r < 85) {
            (host->fail)(c, "flaky", "retry me", 1, NULL);
        } else {
            /* A buggy plugin completing twice: the second must be dropped. */
            host->complete(c, "1");
            int rc = host->complete(c, "2");
            if (rc != JD_PLUGIN_ESTALE)
                abort();
        }
    }
}

struct slot {
    _Atomic int done; /* how many times done() fired: must end at exactly 1 */
    _Atomic bool ok;
    struct jd_call_handle *h; /* for the canceller; NULL otherwise */
    _Atomic bool cancel_ready;
};

static _Atomic uint64_t finished; /* release: pairs with the submitter's acquire */

static void on_done(void *arg, const struct jd_call_result *res)
{
    struct slot *s = arg;
    atomic_store_explicit(&s->ok, res->ok, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->done, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&finished, 1, memory_order_release);
}

struct canceller {
    struct jd_registry *r;
    struct slot *slots;
    size_t n;
    _Atomic size_t submitted; /* release by the submitter: slots below are set up */
    _Atomic bool stop;
};

static void *canceller_main(void *arg)
{
    struct canceller *k = arg;
    size_t next = 0;
    while (!atomic_load_explicit(&k->stop, memory_order_acquire) || next < k->n) {
        size_t upto = atomic_load_explicit(&k->submitted, memory_order_acquire);
        if (next >= upto) {
            if (atomic_load_explicit(&k->stop, memory_order_acquire))
                break;
            sched_yield();
            continue;
        }
        struct slot *s = &k->slots[next++];
        if (atomic_load_explicit(&s->cancel_ready, memory_order_acquire))
            jd_registry_call_cancel(k->r, s->h);
    }
    return NULL;
}

static void test_stress_calls(void **state)
{
    (void)state;
    const char *mode = getenv("JD_STRESS");
    size_t n = mode && strcmp(mode, "long") == 0 ? 300000 : 50000;
    struct penv env;
    struct jd_registry *r;
    struct jd_error err;
    pthread_t th[COMPLETERS], kt;
    struct slot *slots = calloc(n, sizeof *slots);
    struct canceller k = {.slots = slots, .n = n};

    penv_init(&env, true);
    struct jd_plugin_env pe = penv_env(&env);
    assert_int_equal(jd_registry_create(&pe, &r), 0);
    assert_int_equal(jd_registry_add(r, racer_entry, "racer (stress)", &err), 0);
    jd_registry_freeze(r);
    k.r = r;
    for (int i = 0; i < COMPLETERS; i++)
        pthread_create(&th[i], NULL, completer, (void *)(uintptr_t)(i + 1));
    pthread_create(&kt, NULL, canceller_main, &k);

    for (size_t i = 0; i < n; i++) {
        while (i - atomic_load_explicit(&finished, memory_order_acquire) >= MAX_IN_FLIGHT)
            sched_yield();
        struct jd_call_request req = {
            .command = i % 97 == 0 ? "no.such.command" : "racer",
            .args_json = "{}",
            .idempotency_key = "s:1",
            .timeout_ms = i % 4 == 0 ? 1 : 2000,
            .retry = {.max_attempts = i % 5 == 0 ? 3 : 1, .backoff_ms = 1, .factor = 2},
            .done = on_done,
            .arg = &slots[i],
        };
        bool cancel = i % 7 == 0;
        assert_int_equal(jd_registry_call(r, &req, cancel ? &slots[i].h : NULL), 0);
        if (cancel)
            atomic_store_explicit(&slots[i].cancel_ready, true, memory_order_release);
        atomic_store_explicit(&k.submitted, i + 1, memory_order_release);
    }
    atomic_store_explicit(&k.stop, true, memory_order_release);
    pthread_join(kt, NULL);

    uint64_t end = penv_mono_ms() + 120000;
    while (atomic_load_explicit(&finished, memory_order_acquire) < n && penv_mono_ms() < end)
        usleep(1000);
    assert_int_equal(atomic_load_explicit(&finished, memory_order_acquire), n);

    pthread_mutex_lock(&q_mu);
    q_stop = true;
    pthread_cond_broadcast(&q_cond);
    pthread_mutex_unlock(&q_mu);
    for (int i = 0; i < COMPLETERS; i++)
        pthread_join(th[i], NULL);

    size_t ok = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(atomic_load_explicit(&slots[i].done, memory_order_relaxed), 1);
        ok += atomic_load_explicit(&slots[i].ok, memory_order_relaxed);
        jd_registry_call_release(slots[i].h);
    }
    struct jd_registry_stats st;
    jd_registry_stats(r, &st);
    assert_int_equal(st.calls, n);
    assert_int_equal(st.ok, ok);
    assert_int_equal(st.ok + st.failed + st.cancelled, n);
    assert_true(st.unknown_command > 0);
    assert_true(st.timeouts > 0);
    assert_true(st.late_dropped > 0);
    printf("# %zu calls: ok %llu failed %llu cancelled %llu timeouts %llu retries %llu "
           "late_dropped %llu hook_cancels %llu\n",
           n, (unsigned long long)st.ok, (unsigned long long)st.failed,
           (unsigned long long)st.cancelled, (unsigned long long)st.timeouts,
           (unsigned long long)st.retries, (unsigned long long)st.late_dropped,
           (unsigned long long)atomic_load(&hook_cancels));
    jd_registry_destroy(r);
    penv_fini(&env);
    free(slots);
    free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_stress_calls)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
