/*
 * Job definitions: parse and validate the three shapes of docs/architecture.md,
 * "Processes and job shapes"
 * (a single `handler`, a `steps` workflow, an explicit `process` + `method`)
 * with the common options, and flatten workflow steps so that each step owns
 * one fixed yield tag (its index + 1). Tags therefore depend only on the
 * definition, never on timing, which is what lets a replay after a restart
 * match recorded completions to the same steps.
 *
 * Every rejection fills struct jd_error with a JSON pointer to the offending
 * place and a message saying what is wrong; limit violations return
 * JD_ETOOBIG, malformed JSON JD_EPARSE, everything else JD_EINVAL.
 *
 * Threading: a parsed struct jd_jobdef is immutable and may be read from any
 * thread; parsing itself touches no shared state (the registry, when given,
 * is frozen and lock-free).
 */
#ifndef JD_SERVER_JOBDEF_H
#define JD_SERVER_JOBDEF_H

#include "common/error.h"
#include "plugins/registry.h"
#include "server/jobs.h"

#include <cJSON.h>
#include <stdbool.h>
#include <stdint.h>

enum jd_jobdef_shape {
    JD_JOBDEF_TASK = 0,     /* {"handler": .., "args": ..} */
    JD_JOBDEF_WORKFLOW = 1, /* {"steps": [..]} */
    JD_JOBDEF_PROCESS = 2,  /* {"process": .., "method": .., "input": ..} */
};

enum jd_jobdef_step_kind {
    JD_JSTEP_CALL = 0,
    JD_JSTEP_SLEEP = 1,
    JD_JSTEP_WAIT = 2,
    JD_JSTEP_PARALLEL = 3,
};

/* Command names the job layer serves itself (durable timers). The leading
 * '$' cannot collide with plugin command names ([a-z][a-z0-9_.-]*). */
#define JD_CMD_SLEEP "$sleep" /* args {"ms": n}: completes after n ms, deadline recorded */
#define JD_CMD_TIMER "$timer" /* same, used for wait timeouts */

/* One step, flattened: steps[i] yields with tag i + 1. Parallel children
 * follow their group; top-level steps have parent == -1. Pointers into the
 * definition's cJSON tree are valid as long as the jd_jobdef. After
 * jd_jobdef_slim a CALL step's args are either args_text (no "${" in them:
 * what substitution would produce, rendered once; args is then NULL) or a
 * tree kept for substitution (args_text NULL). */
struct jd_jobdef_step {
    enum jd_jobdef_step_kind kind;
    const char *id;
    const char *call;   /* CALL: command name */
    const cJSON *args;  /* CALL: args object (or NULL: {} unless args_text) */
    char *args_text;    /* CALL, after jd_jobdef_slim: args as compact JSON (owned), or NULL */
    int64_t sleep_ms;   /* SLEEP */
    const char *topic;  /* WAIT */
    int64_t timeout_ms; /* CALL: per attempt (0: handler default); WAIT: 0 = forever */
    bool has_retry;     /* CALL: step-level retry given */
    struct jd_retry_policy retry;
    int parent;       /* index of the PARALLEL group, or -1 */
    size_t nchildren; /* PARALLEL: children at [index+1, index+nchildren] */
};

/* What a submit whose unique key is held does (jobs.h says what the
 * caller sees). */
enum jd_unique_conflict {
    JD_UNIQUE_RETURN_EXISTING = 0, /* the default */
    JD_UNIQUE_REJECT = 1,
    JD_UNIQUE_REPLACE = 2,
};
#define JD_UNIQUE_KEY_MAX 256 /* bytes; keys are looked up in memory and indexed on disk */

struct jd_jobdef {
    enum jd_jobdef_shape shape;
    cJSON *root;       /* the parsed definition (owned) */
    char *text;        /* root printed compactly: what is stored (owned) */
    const char *queue; /* "default" when absent */
    int64_t priority;
    int64_t delay_ms;   /* 0 when absent */
    int64_t run_at_ms;  /* 0 when absent */
    int64_t timeout_ms; /* whole job; 0: none */
    bool has_retry;
    struct jd_retry_policy retry; /* job level: default for every call */
    const cJSON *labels;          /* or NULL */
    const cJSON *input;           /* or NULL */
    /* "unique": {"key", "while", "for_ms", "on_conflict"} (unique jobs) */
    bool has_unique;
    const char *unique_key;            /* 1..JD_UNIQUE_KEY_MAX bytes; borrowed from root */
    bool unique_while_queued;          /* "while": "queued" (default "active") */
    int64_t unique_for_ms;             /* hold at most this long after submit; 0: no bound */
    enum jd_unique_conflict unique_on; /* "on_conflict" */
    /* "notify": {"url": "...", "on": ["succeeded", "failed"]} (issue 19) */
    const char *notify_url;  /* or NULL */
    unsigned notify_on;      /* 1 << enum jd_job_state for the end states that send it */
    const char *traceparent; /* W3C trace context of the submit, or NULL (issue 19) */
    /* PROCESS */
    const char *process, *method;
    /* TASK and WORKFLOW: the flattened steps (TASK: one CALL step "task") */
    struct jd_jobdef_step *steps;
    size_t nsteps;
    /* After jd_jobdef_slim: root and labels are NULL, the strings above and
     * the trees still needed (input and args that substitution reads) live
     * in kept; a PROCESS job's input is input_text. */
    cJSON *kept;      /* owned, or NULL */
    char *input_text; /* PROCESS: compact input (owned), or NULL for none */
    bool slim;
    /* Bytes the definition holds in memory (an estimate counting allocator
     * overhead), set by jd_jobdef_slim; charged to *charged_to while the
     * definition is charged (jd_jobdef_charge) and given back when freed. */
    size_t mem;
    _Atomic size_t *charged_to;
};

/* The limits with zeros replaced by their defaults. */
struct jd_job_limits jd_jobdef_limits(const struct jd_job_limits *l);

/*
 * Parse and validate `len` bytes of JSON. registry (borrowed, frozen; may be
 * NULL to skip handler and process-type checks) supplies the validate hooks.
 * On success *out is the definition (caller frees with jd_jobdef_free).
 */
int jd_jobdef_parse(const char *text, size_t len, const struct jd_job_limits *limits,
                    const struct jd_registry *registry, struct jd_jobdef **out,
                    struct jd_error *err);
/* Validate an already parsed value (e.g. one element of a batch) found at
 * JSON pointer `base` ("" or "/jobs/3"); takes ownership of root. */
int jd_jobdef_from_json(cJSON *root, const char *base, const struct jd_job_limits *limits,
                        const struct jd_registry *registry, struct jd_jobdef **out,
                        struct jd_error *err);
void jd_jobdef_free(struct jd_jobdef *d);

/*
 * Keep only what a live job needs, so that a definition costs about its text
 * while queued or running rather than its parsed tree (a 1 MB definition of
 * 60,000 members is ~7 MB as cJSON): render each CALL step's args once when
 * they hold no "${" (substitution would copy them as they are), keep the
 * trees substitution reads (args with references, and the input when any
 * step has them), render a PROCESS job's input to input_text, copy the
 * strings the struct points to, free the rest, and set d->mem. The text
 * stays. Idempotent. Any thread; d must not be in use by another.
 */
void jd_jobdef_slim(struct jd_jobdef *d);

/* Add d->mem to *counter (slimming d first) and give it back when d is
 * freed. At most one counter per definition; atomic (relaxed: a gauge). */
void jd_jobdef_charge(struct jd_jobdef *d, _Atomic size_t *counter);

/*
 * Parse and validate a batch {"jobs": [definition, ...]} of `len` bytes: at
 * most limits->max_batch jobs, each validated as jd_jobdef_from_json does at
 * pointer /jobs/<i>. The first problem rejects the whole batch. On success
 * *out is an array of *n definitions (caller frees each with jd_jobdef_free
 * and the array with free).
 */
int jd_jobdef_parse_batch(const char *text, size_t len, const struct jd_job_limits *limits,
                          const struct jd_registry *registry, struct jd_jobdef ***out, size_t *n,
                          struct jd_error *err);

/* The retry policy in force for the yield with this tag: the step's, else
 * the job's, else a single attempt. */
struct jd_retry_policy jd_jobdef_retry_for_tag(const struct jd_jobdef *d, uint32_t tag);

/* Limits checks shared with batch parsing: 0, or JD_ETOOBIG/JD_EPARSE. */
int jd_jobdef_check_text(const char *text, size_t len, const struct jd_job_limits *limits,
                         struct jd_error *err);

/* ---- substitution (server/subst.c) ---- */

/* What ${...} can refer to; all borrowed. */
struct jd_subst_ctx {
    const cJSON *input;   /* ${input...}; may be NULL */
    const cJSON *steps;   /* object id -> output, ${steps.<id>.output...}; may be NULL */
    const char *job_id;   /* ${job.id}; NULL leaves it unsubstituted */
    bool keep_unresolved; /* leave ${steps..} (and unresolvable refs) as written */
    /* The bounds on what substitution may produce, so that a small definition
     * cannot ask for a huge one: no string longer than max_string bytes, and
     * the whole result no larger than max_bytes as compact JSON. 0: the
     * default job limits' max_string and max_definition_bytes (a string or a
     * definition a client could not have sent is not made by substitution
     * either). Submit passes the configured limits; the workflow at run time
     * uses the defaults. */
    size_t max_string;
    size_t max_bytes;
    size_t *bytes; /* if not NULL, receives the result's size as compact JSON */
};

/* A deep copy of v with every ${...} in its strings substituted. A string
 * that is exactly one reference takes the referenced value's type; inside a
 * longer string the value is spliced in as text (strings raw, others as
 * compact JSON). Caller frees with cJSON_Delete. Returns NULL and fills err
 * if a reference is malformed or does not resolve (JD_EINVAL, message naming
 * the reference) or the result would pass ctx's bounds (JD_ETOOBIG, message
 * naming the limit); err's pointer is the place in v. Time and memory are
 * linear in the size of v and the bounds, whatever v refers to. */
cJSON *jd_subst(const cJSON *v, const struct jd_subst_ctx *ctx, struct jd_error *err);

/* Check the syntax of every reference in v (at pointer ptr): known roots
 * only, and ${steps.<id>...} must name a step for which known(arg, id) is
 * true. 0 or JD_EINVAL with the pointer of the string. *nrefs (may be
 * NULL) receives the number of references found ("$${" is not one). */
int jd_subst_check(const cJSON *v, const char *ptr, bool (*known)(void *arg, const char *id),
                   void *arg, size_t *nrefs, struct jd_error *err);

/* Append a JSON pointer token (escaping ~ and /) to buf. */
void jd_ptr_append(char *buf, size_t cap, const char *token);

/* A JSON pointer kept as a chain of stack frames while walking a tree, and
 * formatted only when an error needs it (building it at every node would
 * cost O(depth) per node). A frame is a member (key) or an array element
 * (key NULL, index). */
struct jd_ptr_frame {
    const struct jd_ptr_frame *up; /* the parent's frame; NULL at the top */
    const char *key;
    size_t index;
};

/* base followed by the tokens from the top frame down to f, into buf. */
void jd_ptr_frame_format(const struct jd_ptr_frame *f, const char *base, char *buf, size_t cap);

/* cJSON_PrintUnformatted(v), byte for byte (server/render.c), without
 * printf and sscanf for integers of up to 15 digits and with one growing
 * buffer; NULL where cJSON gives NULL (an invalid or empty raw item). The
 * caller frees the text. */
char *jd_json_print(const cJSON *v);

#endif
