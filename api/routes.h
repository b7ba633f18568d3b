/*
 * The route table: one row per (method, path pattern). Adding a route is
 * adding a row here and writing its handler in a routes_*.c file (declared
 * in api/http_impl.h; enum MHD_Result handler(struct jd_req *r)), plus its
 * entry in api/openapi.yaml. The route id (enum jd_route), the metrics
 * label, 404 and 405 (with the Allow header), the bearer token, the body
 * checks and the refusal while draining all follow from the row.
 *
 * A row is X(id, method, pattern, handler, flags):
 *   method   one JD_M_* bit (a GET route also answers HEAD)
 *   pattern  "/"-separated segments: a literal, "{name}" for any one
 *            segment (the match's param), or a final "*" for the rest of
 *            the path, zero or more segments (the param, without its
 *            leading "/"); the pattern is also the route's metrics label.
 *            A literal beats "{name}", which beats "*".
 *   flags    JD_RF_* (api/router.h): V1 (needs the bearer token), JOBS
 *            (503 until the job layer is attached), WRITE (503 while
 *            draining), JSON (takes a JSON body: Content-Type, non-empty,
 *            UTF-8), WORKER (--worker-token opens it too).
 *
 * Only api/router.h includes this file; the handler column is used only
 * where http_impl.h declares the handlers (api/http.c), so the router
 * itself (and its fuzzer) link without the server.
 */
#ifndef JD_API_ROUTES_H
#define JD_API_ROUTES_H

/* clang-format off */
#define JD_ROUTES(X)                                                                               \
    X(JD_ROUTE_JOB_SUBMIT,   JD_M_POST, "/v1/jobs",                  route_job_submit,             \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_JSON)                                            \
    X(JD_ROUTE_JOB_LIST,     JD_M_GET,  "/v1/jobs",                  route_job_list,               \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_JOB_BATCH,    JD_M_POST, "/v1/jobs/batch",            route_job_batch,              \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_JSON)                                            \
    X(JD_ROUTE_JOB_GET,      JD_M_GET,  "/v1/jobs/{id}",             route_job_get,                \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_JOB_EVENTS,   JD_M_GET,  "/v1/jobs/{id}/events",      route_job_events,             \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_JOB_CANCEL,   JD_M_POST, "/v1/jobs/{id}/cancel",      route_job_cancel,             \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE)                                                         \
    X(JD_ROUTE_JOB_MESSAGE,  JD_M_POST, "/v1/jobs/{id}/messages",    route_job_message,            \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_JSON)                                            \
    X(JD_ROUTE_JOB_RETRY,    JD_M_POST, "/v1/jobs/{id}/retry",       route_job_retry,              \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE)                                                         \
    X(JD_ROUTE_JOB_DELETE,   JD_M_DELETE, "/v1/jobs/{id}",           route_job_delete,             \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE)                                                         \
    X(JD_ROUTE_JOBS_CANCEL,  JD_M_POST, "/v1/jobs/cancel",           route_jobs_bulk,              \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_JSON)                                            \
    X(JD_ROUTE_JOBS_RETRY,   JD_M_POST, "/v1/jobs/retry",            route_jobs_bulk,              \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_JSON)                                            \
    X(JD_ROUTE_OPERATION_GET, JD_M_GET, "/v1/operations/{id}",       route_operation_get,          \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_EVENTS,       JD_M_GET,  "/v1/events",                route_events,                 \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_HANDLERS,     JD_M_GET,  "/v1/handlers",              route_handlers,               \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_QUEUES,       JD_M_GET,  "/v1/queues",                route_queues,                 \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_QUEUE_GET,    JD_M_GET,  "/v1/queues/{queue}",        route_queue_get,              \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_QUEUE_PUT,    JD_M_PUT,  "/v1/queues/{queue}",        route_queue_put,              \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_JSON)                                            \
    X(JD_ROUTE_QUEUE_PAUSE,  JD_M_POST, "/v1/queues/{queue}/pause",  route_queue_pause,            \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE)                                                         \
    X(JD_ROUTE_QUEUE_RESUME, JD_M_POST, "/v1/queues/{queue}/resume", route_queue_pause,            \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE)                                                         \
    X(JD_ROUTE_SCHEDULE_LIST,    JD_M_GET,    "/v1/schedules",           route_schedule_list,      \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_SCHEDULE_PUT,     JD_M_PUT,    "/v1/schedules/{id}",      route_schedule_put,       \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_JSON)                                            \
    X(JD_ROUTE_SCHEDULE_GET,     JD_M_GET,    "/v1/schedules/{id}",      route_schedule_get,       \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_SCHEDULE_DELETE,  JD_M_DELETE, "/v1/schedules/{id}",      route_schedule_delete,    \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE)                                                         \
    X(JD_ROUTE_SCHEDULE_PAUSE,   JD_M_POST,   "/v1/schedules/{id}/pause", route_schedule_pause,    \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE)                                                         \
    X(JD_ROUTE_SCHEDULE_RESUME,  JD_M_POST,   "/v1/schedules/{id}/resume", route_schedule_pause,   \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE)                                                         \
    X(JD_ROUTE_SCHEDULE_TRIGGER, JD_M_POST,   "/v1/schedules/{id}/trigger", route_schedule_trigger, \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE)                                                         \
    X(JD_ROUTE_SCHEDULE_EVENTS,  JD_M_GET,    "/v1/schedules/{id}/events", route_schedule_events,  \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_COMMAND_LIST,   JD_M_GET,    "/v1/commands",            route_command_list,         \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_COMMAND_PUT,    JD_M_PUT,    "/v1/commands/{name}",     route_command_put,          \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_WORKER)                                          \
    X(JD_ROUTE_COMMAND_GET,    JD_M_GET,    "/v1/commands/{name}",     route_command_get,          \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_COMMAND_DELETE, JD_M_DELETE, "/v1/commands/{name}",     route_command_delete,       \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE)                                                         \
    X(JD_ROUTE_TASK_CLAIM,     JD_M_POST,   "/v1/tasks/claim",         route_task_claim,           \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_JSON | JD_RF_WORKER)                             \
    X(JD_ROUTE_TASK_BATCH,     JD_M_POST,   "/v1/tasks/complete",      route_task_batch,           \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_JSON | JD_RF_WORKER)                             \
    X(JD_ROUTE_TASK_COMPLETE,  JD_M_POST,   "/v1/tasks/{id}/complete", route_task_complete,        \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_JSON | JD_RF_WORKER)                             \
    X(JD_ROUTE_TASK_FAIL,      JD_M_POST,   "/v1/tasks/{id}/fail",     route_task_fail,            \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_JSON | JD_RF_WORKER)                             \
    X(JD_ROUTE_TASK_HEARTBEAT, JD_M_POST,   "/v1/tasks/{id}/heartbeat", route_task_heartbeat,      \
      JD_RF_V1 | JD_RF_JOBS | JD_RF_WRITE | JD_RF_WORKER)                                          \
    X(JD_ROUTE_WORKERS,        JD_M_GET,    "/v1/workers",             route_workers,              \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_OPENAPI,      JD_M_GET,  "/v1/openapi.yaml",          route_openapi,                \
      JD_RF_V1)                                                                                    \
    X(JD_ROUTE_STATS,        JD_M_GET,  "/v1/stats",                 route_stats,                  \
      JD_RF_V1 | JD_RF_JOBS)                                                                       \
    X(JD_ROUTE_UI_ROOT,      JD_M_GET,  "/",                         route_ui_root,     0)         \
    X(JD_ROUTE_UI_FILE,      JD_M_GET,  "/ui/*",                     route_ui_file,     0)         \
    X(JD_ROUTE_LIVEZ,        JD_M_GET,  "/livez",                    route_livez,       0)         \
    X(JD_ROUTE_READYZ,       JD_M_GET,  "/readyz",                   route_readyz,      0)         \
    X(JD_ROUTE_METRICS,      JD_M_GET,  "/metrics",                  route_metrics,     0)
/* clang-format on */

#endif
