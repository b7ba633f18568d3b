/*
 * Slimming a job definition for its life in memory (jd_jobdef_slim) and
 * charging what it keeps to a counter (jd_jobdef_charge; server/jobdef.h
 * states the contract). A live job keeps its definition's text, each call
 * step's args as text (a tree only where "${" needs one), the trees
 * substitution reads, and copies of the few strings it looks at; the
 * parsed root goes. What is kept is counted in d->mem the way glibc's
 * malloc spends it, so --max-job-memory bounds real heap.
 *
 * Threading: on the thread that owns d, before d is shared.
 */
#include "server/jobdef.h"

#include "common/alloc.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void slim_oom(const char *what)
{
    fprintf(stderr, "jackdaw: out of memory (%s)\n", what);
    abort();
}

/* What a heap block of n bytes costs with glibc's malloc: 8 bytes of header,
 * rounded up to 16, at least 32. */
static size_t heap_cost(size_t n)
{
    size_t c = (n + 8 + 15) & ~(size_t)15;
    return c < 32 ? 32 : c;
}

static size_t text_cost(const char *s)
{
    return s ? heap_cost(strlen(s) + 1) : 0;
}

/* The heap a cJSON tree holds: each node, its key and its string. */
static size_t tree_cost(const cJSON *v)
{
    size_t n = 0;
    for (; v; v = v->next) {
        n += heap_cost(sizeof *v) + text_cost(v->string);
        if (cJSON_IsString(v))
            n += text_cost(v->valuestring);
        n += tree_cost(v->child);
    }
    return n;
}

/* Could substitution change v: does any string value hold "${" (which
 * includes the escape "$${")? Keys are never substituted. */
static bool has_refs(const cJSON *v)
{
    if (cJSON_IsString(v))
        return strstr(v->valuestring, "${") != NULL;
    for (const cJSON *c = v ? v->child : NULL; c; c = c->next)
        if (has_refs(c))
            return true;
    return false;
}

/* A copy of s owned by d->kept; NULL stays NULL. */
static const char *keep_string(struct jd_jobdef *d, const char *s)
{
    if (!s)
        return NULL;
    cJSON *c = cJSON_CreateString(s);
    if (!c || !c->valuestring)
        slim_oom("jobdef string");
    cJSON_AddItemToArray(d->kept, c);
    return c->valuestring;
}

/* A deep copy of v owned by d->kept; NULL stays NULL. */
static const cJSON *keep_tree(struct jd_jobdef *d, const cJSON *v)
{
    if (!v)
        return NULL;
    cJSON *c = cJSON_Duplicate(v, 1);
    if (!c)
        slim_oom("jobdef tree");
    cJSON_AddItemToArray(d->kept, c);
    return c;
}

void jd_jobdef_slim(struct jd_jobdef *d)
{
    if (!d || d->slim)
        return;
    d->slim = true;
    d->kept = cJSON_CreateArray();
    if (!d->kept)
        slim_oom("jobdef");
    bool refs = false;
    for (size_t i = 0; i < d->nsteps; i++) {
        struct jd_jobdef_step *s = &d->steps[i];
        s->id = keep_string(d, s->id);
        s->call = keep_string(d, s->call);
        s->topic = keep_string(d, s->topic);
        if (s->kind != JD_JSTEP_CALL)
            continue;
        if (s->args && has_refs(s->args)) {
            refs = true;
            s->args = keep_tree(d, s->args);
        } else {
            s->args_text = s->args ? jd_json_print(s->args) : jd_xstrdup("{}");
            if (!s->args_text)
                slim_oom("jobdef args");
            s->args = NULL;
        }
    }
    if (d->shape == JD_JOBDEF_PROCESS) {
        if (d->input && !(d->input_text = jd_json_print(d->input)))
            slim_oom("jobdef input");
        d->input = NULL;
    } else {
        d->input = refs ? keep_tree(d, d->input) : NULL;
    }
    d->queue = keep_string(d, d->queue);
    d->unique_key = keep_string(d, d->unique_key);
    d->notify_url = keep_string(d, d->notify_url);
    d->traceparent = keep_string(d, d->traceparent);
    d->process = keep_string(d, d->process);
    d->method = keep_string(d, d->method);
    d->labels = NULL;
    cJSON_Delete(d->root);
    d->root = NULL;
    d->mem =
        heap_cost(sizeof *d) + text_cost(d->text) + text_cost(d->input_text) + tree_cost(d->kept);
    if (d->nsteps)
        d->mem += heap_cost(d->nsteps * sizeof *d->steps);
    for (size_t i = 0; i < d->nsteps; i++)
        d->mem += text_cost(d->steps[i].args_text);
}

void jd_jobdef_charge(struct jd_jobdef *d, _Atomic size_t *counter)
{
    if (!d || d->charged_to)
        return;
    jd_jobdef_slim(d);
    d->charged_to = counter;
    atomic_fetch_add_explicit(counter, d->mem, memory_order_relaxed);
}
