/*
 * The jd_step_* helpers of scheduler/process.h: how a process's step fills
 * its struct jd_step_out. The output buffer belongs to the worker running the
 * step (one per worker), so nothing here is shared between threads.
 * Invariant: after jd_step_out_reset the output holds no memory except the
 * yields array, which is kept for reuse (cap) and freed by the owner.
 */
#include "scheduler/process.h"

#include "common/alloc.h"

#include <stdlib.h>

void jd_step_yield(struct jd_step_out *out, uint32_t tag, const char *command, const char *args,
                   int64_t timeout_ms)
{
    if (out->nyields == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 4;
        out->yields = jd_xrealloc(out->yields, cap * sizeof(*out->yields));
        out->cap = cap;
    }
    struct jd_yield *y = &out->yields[out->nyields++];
    y->tag = tag;
    y->command = command ? jd_xstrdup(command) : NULL;
    y->args = args ? jd_xstrdup(args) : NULL;
    y->timeout_ms = timeout_ms;
}

static void clear_result(struct jd_step_out *out)
{
    free(out->result);
    free(out->error);
    out->result = NULL;
    out->error = NULL;
}

void jd_step_done(struct jd_step_out *out, const char *result)
{
    jd_step_done_take(out, result ? jd_xstrdup(result) : NULL);
}

void jd_step_done_take(struct jd_step_out *out, char *result)
{
    clear_result(out);
    out->status = JD_STEP_DONE;
    out->result = result;
}

void jd_step_fail(struct jd_step_out *out, const char *error)
{
    jd_step_fail_take(out, jd_xstrdup(error ? error : "{\"kind\":\"failed\"}"));
}

void jd_step_fail_take(struct jd_step_out *out, char *error)
{
    clear_result(out);
    out->status = JD_STEP_FAIL;
    out->error = error ? error : jd_xstrdup("{\"kind\":\"failed\"}");
}

void jd_step_out_reset(struct jd_step_out *out)
{
    for (size_t i = 0; i < out->nyields; i++) {
        free(out->yields[i].command);
        free(out->yields[i].args);
    }
    out->nyields = 0;
    clear_result(out);
    out->status = JD_STEP_CONTINUE;
}
