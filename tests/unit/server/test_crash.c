/*
 * Crash and replay, the way it happens for real: a forked child runs the job
 * layer on a database and keeps submitting workflows whose `exec` steps each
 * append one line "<job>:<step>" to a file; the parent SIGKILLs it at a
 * random moment, 20 rounds (JD_STRESS=long: 100), each child resuming what
 * the previous one left. Finally the parent resumes the layer itself until
 * everything is done and checks:
 *   - every job whose submit was acknowledged (done fired: durable) reaches a
 *     terminal state, and succeeds;
 *   - no step whose completion was recorded before a round started ran in
 *     that round (line counts per step before/after each round against the
 *     completions recorded at its start);
 *   - every step ran at least once and has exactly one recorded completion.
 * It prints the counts (rounds, jobs, steps, re-executions of steps that
 * were in flight at a kill). Needs $JD_BUILD/plugins/exec.so.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "jobs_test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define NSTEPS 4 /* s1, then s2a + s2b in parallel, then s3 */
static const char *const step_names[NSTEPS] = {"s1", "s2a", "s2b", "s3"};
static const uint32_t step_tags[NSTEPS] = {1, 3, 4, 5}; /* flattened index + 1 */

struct ctx {
    char dir[128], db[192], lines[192], accepted[192], plugins[256];
    char def[1600];
};

static void child_submit_done(void *arg, const struct jd_submit_result *res)
{
    struct ctx *c = arg;
    if (res->rc != 0)
        return;
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%lld\n", (long long)res->job_id);
    int fd = open(c->accepted, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd >= 0) {
        if (write(fd, buf, (size_t)n) != n)
            _exit(3);
        close(fd);
    }
}

/* The child: resume, then submit forever (until killed). */
static void child_main(struct ctx *c, unsigned seed)
{
    struct jd_store *store;
    struct jd_store_config sc = {.path = c->db, .sync_full = false};
    struct jd_error err;
    if (jd_store_open(&sc, &store, &err) != 0) {
        fprintf(stderr, "child: store: %s\n", err.message);
        _exit(2);
    }
    struct jd_jobs_config cfg = {
        .store = store, .workers = 2, .plugin_dir = c->plugins, .exec_allow = "/bin/sh"};
    struct jd_jobs *j;
    if (jd_jobs_create(&cfg, &j, &err) != 0) {
        fprintf(stderr, "child: jobs: %s\n", err.message);
        _exit(2);
    }
    srand(seed);
    for (;;) {
        if (jd_jobs_submit(j, c->def, strlen(c->def), NULL, child_submit_done, c, &err) != 0) {
            fprintf(stderr, "child: submit: %s\n", err.message);
            _exit(2);
        }
        usleep(5000 + (useconds_t)(rand() % 20000));
    }
}

/* Lines per (job, step) in the lines file. */
struct counts {
    int64_t *ids;
    int (*n)[NSTEPS];
    size_t len, cap;
};

static int idx_of(struct counts *k, int64_t id, bool add)
{
    for (size_t i = 0; i < k->len; i++)
        if (k->ids[i] == id)
            return (int)i;
    if (!add)
        return -1;
    if (k->len == k->cap) {
        k->cap = k->cap ? k->cap * 2 : 64;
        k->ids = realloc(k->ids, k->cap * sizeof *k->ids);
        k->n = realloc(k->n, k->cap * sizeof *k->n);
    }
    k->ids[k->len] = id;
    memset(k->n[k->len], 0, sizeof k->n[k->len]);
    return (int)k->len++;
}

static void count_lines(const char *path, struct counts *k)
{
    for (size_t i = 0; i < k->len; i++)
        memset(k->n[i], 0, sizeof k->n[i]);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[128];
    while (fgets(line, sizeof line, f)) {
        long long id;
        char step[16];
        if (sscanf(line, "%lld:%15s", &id, step) != 2)
            fail_msg("garbled line %s", line);
        int i = idx_of(k, id, true);
        for (int s = 0; s < NSTEPS; s++)
            if (strcmp(step, step_names[s]) == 0)
                k->n[i][s]++;
    }
    fclose(f);
}

/* Recorded completions per (job, step), read from the database. */
static void count_completions(struct ctx *c, struct counts *k)
{
    for (size_t i = 0; i < k->len; i++)
        memset(k->n[i], 0, sizeof k->n[i]);
    struct jd_store *store;
    struct jd_store_config sc = {.path = c->db};
    struct jd_error err;
    if (jd_store_open(&sc, &store, &err) != 0)
        fail_msg("parent store: %s", err.message);
    struct jd_job_filter f = {.state = -1, .limit = 1000};
    for (;;) {
        struct jd_job *rows;
        size_t n;
        int64_t next;
        assert_int_equal(jd_store_job_list(store, &f, &rows, &n, &next), 0);
        for (size_t r = 0; r < n; r++) {
            struct jd_job_event *ev;
            size_t ne;
            assert_int_equal(jd_store_events(store, rows[r].id, 0, 10000, &ev, &ne), 0);
            int i = idx_of(k, rows[r].id, true);
            for (size_t e = 0; e < ne; e++)
                if (ev[e].kind == JD_EVK_COMPLETE)
                    for (int s = 0; s < NSTEPS; s++)
                        if (ev[e].tag == step_tags[s])
                            k->n[i][s]++;
            jd_job_events_free(ev, ne);
        }
        jd_jobs_free(rows, n);
        if (!next)
            break;
        f.before_id = next;
    }
    jd_store_close(store);
}

static void test_kill_restart_rounds(void **state)
{
    (void)state;
    struct ctx c;
    memset(&c, 0, sizeof c);
    const char *build = getenv("JD_BUILD") ? getenv("JD_BUILD") : "build";
    snprintf(c.plugins, sizeof c.plugins, "%s/plugins", build);
    char exec_so[300];
    snprintf(exec_so, sizeof exec_so, "%s/exec.so", c.plugins);
    if (access(exec_so, R_OK) != 0)
        fail_msg("%s is missing (build the plugins first)", exec_so);
    snprintf(c.dir, sizeof c.dir, "/tmp/jd_crash_test_XXXXXX");
    assert_non_null(mkdtemp(c.dir));
    snprintf(c.db, sizeof c.db, "%s/jd.db", c.dir);
    snprintf(c.lines, sizeof c.lines, "%s/lines", c.dir);
    snprintf(c.accepted, sizeof c.accepted, "%s/accepted", c.dir);
    char sh[NSTEPS][320];
    for (int s = 0; s < NSTEPS; s++)
        snprintf(sh[s], sizeof sh[s],
                 "{\"id\":\"%s\",\"call\":\"exec\",\"args\":{\"argv\":[\"/bin/sh\",\"-c\","
                 "\"echo ${job.id}:%s >> %s\"]}}",
                 step_names[s], step_names[s], c.lines);
    snprintf(c.def, sizeof c.def, "{\"steps\":[%s,{\"id\":\"g\",\"parallel\":[%s,%s]},%s]}", sh[0],
             sh[1], sh[2], sh[3]);

    int rounds = getenv("JD_STRESS") && strcmp(getenv("JD_STRESS"), "long") == 0 ? 100 : 20;
    unsigned seed = (unsigned)time(NULL);
    printf("# seed %u\n", seed);
    srand(seed);
    struct counts lines_before = {0}, lines_after = {0}, done_at_start = {0};
    int violations = 0;
    for (int r = 0; r < rounds; r++) {
        if (r > 0)
            count_completions(&c, &done_at_start);
        count_lines(c.lines, &lines_before);
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            child_main(&c, seed + (unsigned)r);
        usleep(100000 + (useconds_t)(rand() % 500000));
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL))
            fail_msg("round %d: child exited on its own (status %d)", r, st);
        usleep(50000); /* let orphaned sh children of the dead layer finish */
        count_lines(c.lines, &lines_after);
        for (size_t i = 0; r > 0 && i < done_at_start.len; i++) {
            int a = idx_of(&lines_after, done_at_start.ids[i], false);
            int b = idx_of(&lines_before, done_at_start.ids[i], false);
            for (int s = 0; s < NSTEPS && a >= 0; s++) {
                int ran = lines_after.n[a][s] - (b >= 0 ? lines_before.n[b][s] : 0);
                if (done_at_start.n[i][s] > 0 && ran > 0) {
                    printf("# job %lld step %s ran again in round %d after its completion "
                           "was recorded\n",
                           (long long)done_at_start.ids[i], step_names[s], r);
                    violations++;
                }
            }
        }
    }

    /* Resume in this process until every accepted job is terminal. */
    struct env e;
    memset(&e, 0, sizeof e);
    snprintf(e.dir, sizeof e.dir, "%s", c.dir);
    snprintf(e.db, sizeof e.db, "%s", c.db);
    env_open_store(&e);
    struct jd_jobs_config cfg = {.workers = 2, .plugin_dir = c.plugins, .exec_allow = "/bin/sh"};
    cfg.register_plugins = NULL;
    cfg.store = e.store;
    struct jd_error err;
    assert_int_equal(jd_jobs_create(&cfg, &e.jobs, &err), 0);
    FILE *f = fopen(c.accepted, "r");
    assert_non_null(f);
    long long id;
    int accepted = 0, succeeded = 0;
    while (fscanf(f, "%lld", &id) == 1) {
        accepted++;
        cJSON *job = wait_terminal(e.jobs, id, 20000);
        if (strcmp(jstate(job), "succeeded") == 0)
            succeeded++;
        else
            printf("# job %lld ended %s\n", id, jstate(job));
        cJSON_Delete(job);
    }
    fclose(f);
    /* A job whose insert committed just before a kill, before its submit was
     * acknowledged, is in the database too and its steps are checked below:
     * let it finish as well (it need not succeed: it was never promised). */
    struct jd_job_filter jf = {.state = -1, .limit = 1000};
    for (;;) {
        struct jd_job *rows;
        size_t n;
        int64_t next;
        assert_int_equal(jd_store_job_list(e.store, &jf, &rows, &n, &next), 0);
        for (size_t r = 0; r < n; r++)
            cJSON_Delete(wait_terminal(e.jobs, rows[r].id, 20000));
        jd_jobs_free(rows, n);
        if (!next)
            break;
        jf.before_id = next;
    }
    jd_jobs_destroy(e.jobs);
    jd_store_close(e.store);

    struct counts comp = {0}, lines = {0};
    count_completions(&c, &comp);
    count_lines(c.lines, &lines);
    int steps = 0, reruns = 0, missing = 0, multi = 0;
    for (size_t i = 0; i < comp.len; i++) {
        int a = idx_of(&lines, comp.ids[i], false);
        for (int s = 0; s < NSTEPS; s++) {
            steps++;
            int ran = a >= 0 ? lines.n[a][s] : 0;
            if (comp.n[i][s] != 1)
                multi++;
            if (ran == 0)
                missing++;
            if (ran > 1)
                reruns += ran - 1;
        }
    }
    printf("# crash test: %d rounds, %d jobs accepted, %d succeeded, %zu jobs in the database, "
           "%d steps, %d re-executions of in-flight steps, %d recorded steps run again, "
           "%d steps without exactly one completion, %d never ran\n",
           rounds, accepted, succeeded, comp.len, steps, reruns, violations, multi, missing);
    assert_true(accepted > rounds);
    assert_int_equal(succeeded, accepted);
    assert_int_equal(violations, 0);
    assert_int_equal(multi, 0);
    assert_int_equal(missing, 0);
    free(lines_before.ids);
    free(lines_before.n);
    free(lines_after.ids);
    free(lines_after.n);
    free(done_at_start.ids);
    free(done_at_start.n);
    free(comp.ids);
    free(comp.n);
    free(lines.ids);
    free(lines.n);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c.dir);
    if (system(cmd) != 0)
        printf("# cleanup failed\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_restart_rounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
