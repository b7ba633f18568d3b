/*
 * Lingering close: a connection answered before its request body was read
 * (413 over --max-body from Content-Length, 401, 404, 415, ...) is closed by
 * libmicrohttpd while the client may still be sending. Closing a socket
 * with unread input makes the kernel send a reset, which destroys the
 * answer before a client that sends the whole body first (Python's
 * http.client, requests, many others) gets to read it: it sees a broken
 * pipe instead of the 413. As nginx and Go's net/http do, such a socket is
 * kept a little longer: our write side is shut (the answer and a FIN go
 * out), and what the client still sends is read and dropped until it
 * closes, for at most LINGER_MS and LINGER_BYTES, then the socket closes.
 *
 * Invariants: at most LINGER_MAX sockets linger at once (more are closed at
 * once, as before), each for a bounded time and number of bytes, so a
 * client cannot hold descriptors or bandwidth with it.
 *
 * Threading: http_linger_add runs on MHD's threads (the connection-closed
 * notifier); one thread of this module reads and closes; `mu` guards the
 * table and is held only for non-blocking work.
 */
#include "api/http_impl.h"

#include "common/alloc.h"
#include "common/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define LINGER_MAX 64                   /* sockets at once; more close at once */
#define LINGER_MS 2000                  /* as Go's net/http (nginx: lingering_time 30 s) */
#define LINGER_BYTES ((size_t)16 << 20) /* read and dropped per socket at most */

struct slot {
    int fd; /* -1: free */
    uint64_t deadline_ns;
    size_t bytes;
};

struct jd_linger {
    pthread_mutex_t mu;
    struct slot slots[LINGER_MAX];
    int ep, evfd;
    bool stop;
    pthread_t thread;
};

static void slot_close_locked(struct jd_linger *l, int i)
{
    epoll_ctl(l->ep, EPOLL_CTL_DEL, l->slots[i].fd, NULL);
    close(l->slots[i].fd);
    l->slots[i].fd = -1;
}

/* Read and drop what is there; close on EOF, error or past the byte cap. */
static void slot_drain_locked(struct jd_linger *l, int i)
{
    static char sink[16384]; /* only this thread reads into it, under mu */
    struct slot *s = &l->slots[i];
    for (;;) {
        ssize_t n = read(s->fd, sink, sizeof sink);
        if (n > 0) {
            s->bytes += (size_t)n;
            if (s->bytes > LINGER_BYTES)
                break;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return; /* all read for now: keep lingering */
        break;      /* EOF: the client is done; or an error */
    }
    slot_close_locked(l, i);
}

static void *linger_main(void *arg)
{
    struct jd_linger *l = arg;
    struct epoll_event ev[32];
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        uint64_t now = jd_now_ns(), next = UINT64_MAX;
        for (int i = 0; i < LINGER_MAX; i++) {
            if (l->slots[i].fd < 0)
                continue;
            if (l->slots[i].deadline_ns <= now)
                slot_close_locked(l, i);
            else if (l->slots[i].deadline_ns < next)
                next = l->slots[i].deadline_ns;
        }
        int ms = next == UINT64_MAX ? -1 : (int)((next - now + 999999ull) / 1000000ull);
        pthread_mutex_unlock(&l->mu);
        int n = epoll_wait(l->ep, ev, (int)(sizeof ev / sizeof ev[0]), ms);
        pthread_mutex_lock(&l->mu);
        for (int k = 0; k < n; k++) {
            if (ev[k].data.u32 == UINT32_MAX) {
                uint64_t v;
                ssize_t got = read(l->evfd, &v, sizeof v);
                (void)got; /* only the wake-up mattered */
                continue;
            }
            int i = (int)(ev[k].data.u32 >> 16), gen = (int)(ev[k].data.u32 & 0xffff);
            /* the slot may have been closed and reused since epoll_wait */
            if (l->slots[i].fd >= 0 && (l->slots[i].fd & 0xffff) == gen)
                slot_drain_locked(l, i);
        }
    }
    for (int i = 0; i < LINGER_MAX; i++)
        if (l->slots[i].fd >= 0)
            slot_close_locked(l, i);
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

int http_linger_start(struct jd_linger **out)
{
    struct jd_linger *l = jd_xcalloc(1, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    for (int i = 0; i < LINGER_MAX; i++)
        l->slots[i].fd = -1;
    l->ep = epoll_create1(EPOLL_CLOEXEC);
    l->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    if (l->ep < 0 || l->evfd < 0 || epoll_ctl(l->ep, EPOLL_CTL_ADD, l->evfd, &ev) != 0 ||
        pthread_create(&l->thread, NULL, linger_main, l) != 0) {
        if (l->ep >= 0)
            close(l->ep);
        if (l->evfd >= 0)
            close(l->evfd);
        pthread_mutex_destroy(&l->mu);
        free(l);
        return JD_EIO;
    }
    pthread_setname_np(l->thread, "jd-http-linger");
    *out = l;
    return 0;
}

void http_linger_add(struct jd_linger *l, int fd)
{
    /* The answer is in the socket's send buffer: shutting our side sends
     * it and then a FIN, telling the client no more is coming. */
    shutdown(fd, SHUT_WR);
    int fl = fcntl(fd, F_GETFL);
    if (l == NULL || fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        close(fd);
        return;
    }
    pthread_mutex_lock(&l->mu);
    int i = 0;
    while (i < LINGER_MAX && l->slots[i].fd >= 0)
        i++;
    if (i == LINGER_MAX || l->stop) {
        pthread_mutex_unlock(&l->mu);
        close(fd); /* full: close now, as without lingering */
        return;
    }
    /* key: slot and the fd's low bits, so a stale event for a reused slot
     * is told apart */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP,
                             .data.u32 = ((uint32_t)i << 16) | ((uint32_t)fd & 0xffff)};
    if (epoll_ctl(l->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        pthread_mutex_unlock(&l->mu);
        close(fd);
        return;
    }
    l->slots[i].fd = fd;
    l->slots[i].deadline_ns = jd_now_ns() + (uint64_t)LINGER_MS * 1000000ull;
    l->slots[i].bytes = 0;
    pthread_mutex_unlock(&l->mu);
    uint64_t one = 1;
    ssize_t w = write(l->evfd, &one, sizeof one); /* the thread recomputes its deadline */
    (void)w;
}

void http_linger_stop(struct jd_linger *l)
{
    if (l == NULL)
        return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_mutex_unlock(&l->mu);
    uint64_t one = 1;
    ssize_t w = write(l->evfd, &one, sizeof one);
    (void)w;
    pthread_join(l->thread, NULL);
    close(l->ep);
    close(l->evfd);
    pthread_mutex_destroy(&l->mu);
    free(l);
}
