/* sse_load: an HTTP/1.1 load client for the relay benchmark that costs almost no CPU.
 *
 * The C twin of bench/relay_load.py (bench/relay.py --harness c). One thread, epoll,
 * non-blocking sockets, CLOCK_MONOTONIC timestamps. It sends one raw HTTP request (the bytes
 * of --request FILE, written by the Python benchmark) --total times over --concurrency
 * connections and records, per response:
 *
 *   stream mode: the status, whether it completed (status 200, a "data: [DONE]" event and the
 *     end of the body: the last chunk, Content-Length or EOF), the SSE events counted at their
 *     blank-line boundary (WHATWG HTML 9.2.6: an event is dispatched by an empty line when it
 *     has a data field; CRLF, LF and CR line ends), the connect time, the TTFT (request
 *     written -> first complete event) and every inter-event gap as the client saw it (events
 *     completed by the same read: gap 0, as bench/relay_load.py counts them);
 *   latency mode: the time from writing the request to the end of its response body.
 *
 * Bodies are decoded from chunked transfer coding (RFC 9112 7.1) or Content-Length, or end at
 * EOF. With --keep-alive a connection carries requests one after another (the request must
 * say Connection: keep-alive); otherwise each request gets a new connection.
 *
 * Output (--out FILE, default stdout), one line per response, times in microseconds:
 *   S <complete 0|1> <status> <events> <connect_us> <ttft_us> <total_us> <gap_us>...
 *   L <complete 0|1> <status> <latency_us>
 * and a last line "T <wall_us> <cpu_us>" (this process's user+system CPU time).
 * Percentiles are computed by the caller from these raw values.
 *
 * Usage: sse_load --port P --request FILE [--host 127.0.0.1] [--mode stream|latency]
 *                 [--total N] [--concurrency C] [--keep-alive] [--timeout-s 300] [--out F]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { P_HEAD, P_SIZE, P_EXT, P_DATA, P_DATA_END, P_TRAILER, P_LENGTH, P_EOF, P_END };

typedef struct {
    int complete, status, events;
    int64_t connect_ns, ttft_ns, total_ns;
    int32_t *gaps;
    int ngaps, gcap;
} result_t;

typedef struct {
    int fd, connected, active;
    size_t req_off;
    int64_t t_connect, t_sent, t_last;
    /* response parser */
    int phase, close_conn, chunked, has_length;
    char head[16384];
    size_t head_len;
    uint64_t remaining, size;
    int trailer_line;
    /* SSE scanner */
    int prev_cr, line_len, has_data, saw_done;
    char line[16];
    result_t r;
} cl_t;

typedef struct {
    const char *host;
    int port, stream, keep_alive, concurrency;
    long total, started, finished;
    char *req;
    size_t req_len;
    int ep;
    result_t *results;
    long nresults;
    struct sockaddr_in addr;
} ctx_t;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void reset(cl_t *c) {
    int fd = c->fd, connected = c->connected;
    int64_t t_connect = c->t_connect;
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->connected = connected;
    c->t_connect = t_connect;
    c->phase = P_HEAD;
}

static void gap(result_t *r, int64_t ns) {
    if (r->ngaps == r->gcap) {
        r->gcap = r->gcap ? r->gcap * 2 : 256;
        r->gaps = realloc(r->gaps, (size_t)r->gcap * sizeof *r->gaps);
        if (!r->gaps) die("realloc");
    }
    r->gaps[r->ngaps++] = (int32_t)(ns / 1000);
}

/* Scan body bytes for SSE line ends; returns the events completed in them. */
static int sse_scan(cl_t *c, const char *p, size_t n) {
    int done = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '\n' && c->prev_cr) {
            c->prev_cr = 0;
            continue;
        }
        if (ch == '\r' || ch == '\n') {
            c->prev_cr = ch == '\r';
            if (c->line_len == 0) {
                if (c->has_data) done++;
                c->has_data = 0;
            } else {
                int len = c->line_len < (int)sizeof c->line ? c->line_len : (int)sizeof c->line;
                if ((len >= 5 && !memcmp(c->line, "data:", 5)) || (len == 4 && !memcmp(c->line, "data", 4))) {
                    c->has_data = 1;
                    const char *v = c->line + 5;
                    int vl = c->line_len - 5;
                    if (vl > 0 && *v == ' ') v++, vl--;
                    if (vl == 6 && !memcmp(v, "[DONE]", 6)) c->saw_done = 1;
                }
            }
            c->line_len = 0;
            continue;
        }
        c->prev_cr = 0;
        if (c->line_len < (int)sizeof c->line) c->line[c->line_len] = ch;
        c->line_len++;
    }
    return done;
}

static void body(ctx_t *x, cl_t *c, const char *p, size_t n) {
    if (x->stream && n) {
        int k = sse_scan(c, p, n);
        if (k) {
            int64_t t = now_ns();
            if (c->r.events == 0) c->r.ttft_ns = t - c->t_sent;
            else gap(&c->r, t - c->t_last);
            for (int i = 1; i < k; i++) gap(&c->r, 0);
            c->t_last = t;
            c->r.events += k;
        }
    }
}

static int parse_head(cl_t *c) {
    char *h = c->head;
    c->r.status = atoi(h + 9);
    c->phase = P_EOF;
    for (char *line = strstr(h, "\r\n"); line && line[2] != '\r'; line = strstr(line + 2, "\r\n")) {
        char *l = line + 2;
        if (!strncasecmp(l, "transfer-encoding:", 18)) {
            c->chunked = strcasestr(l, "chunked") != NULL;
            if (c->chunked) c->phase = P_SIZE;
        } else if (!strncasecmp(l, "content-length:", 15) && !c->chunked) {
            c->remaining = strtoull(l + 15, NULL, 10);
            c->phase = c->remaining ? P_LENGTH : P_END;
        } else if (!strncasecmp(l, "connection:", 11)) {
            c->close_conn = strcasestr(l, "close") != NULL && strcasestr(l, "close") < strstr(l, "\r\n");
        }
    }
    if (c->chunked) c->phase = P_SIZE;
    return 0;
}

/* Feed received bytes; sets phase P_END when the response is complete. */
static void feed(ctx_t *x, cl_t *c, const char *p, size_t n) {
    size_t i = 0;
    while (i < n && c->phase != P_END) {
        switch (c->phase) {
        case P_HEAD: {
            while (i < n && c->head_len < sizeof c->head - 1) {
                c->head[c->head_len++] = p[i++];
                if (c->head_len >= 4 && !memcmp(c->head + c->head_len - 4, "\r\n\r\n", 4)) break;
            }
            c->head[c->head_len] = 0;
            if (c->head_len >= 4 && !memcmp(c->head + c->head_len - 4, "\r\n\r\n", 4)) parse_head(c);
            else if (c->head_len >= sizeof c->head - 1) c->phase = P_END;  /* oversized: fail */
            break;
        }
        case P_SIZE: {
            char ch = p[i++];
            int d = ch >= '0' && ch <= '9' ? ch - '0' : (ch | 32) >= 'a' && (ch | 32) <= 'f' ? (ch | 32) - 'a' + 10 : -1;
            if (d >= 0) c->size = c->size * 16 + (uint64_t)d;
            else if (ch == '\n') {
                if (c->size == 0) {
                    c->phase = P_TRAILER;
                    c->trailer_line = 0;
                } else {
                    c->remaining = c->size;
                    c->phase = P_DATA;
                }
                c->size = 0;
            } else if (ch != '\r') c->phase = P_EXT;
            break;
        }
        case P_EXT:
            if (p[i++] == '\n') {
                if (c->size == 0) c->phase = P_TRAILER;
                else {
                    c->remaining = c->size;
                    c->phase = P_DATA;
                }
                c->size = 0;
            }
            break;
        case P_DATA: {
            size_t take = n - i < c->remaining ? n - i : (size_t)c->remaining;
            body(x, c, p + i, take);
            i += take;
            c->remaining -= take;
            if (!c->remaining) c->phase = P_DATA_END;
            break;
        }
        case P_DATA_END:
            if (p[i++] == '\n') c->phase = P_SIZE;
            break;
        case P_TRAILER: {
            char ch = p[i++];
            if (ch == '\n') {
                if (c->trailer_line == 0) c->phase = P_END;
                c->trailer_line = 0;
            } else if (ch != '\r') c->trailer_line++;
            break;
        }
        case P_LENGTH: {
            size_t take = n - i < c->remaining ? n - i : (size_t)c->remaining;
            body(x, c, p + i, take);
            i += take;
            c->remaining -= take;
            if (!c->remaining) c->phase = P_END;
            break;
        }
        case P_EOF:
            body(x, c, p + i, n - i);
            i = n;
            break;
        }
    }
}

static void watch(ctx_t *x, cl_t *c, int op, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.ptr = c};
    if (epoll_ctl(x->ep, op, c->fd, &ev) < 0) die("epoll_ctl");
}

static int take(ctx_t *x) {
    if (x->started >= x->total) return 0;
    x->started++;
    return 1;
}

static void open_conn(ctx_t *x, cl_t *c) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    c->connected = 0;
    c->t_connect = now_ns();
    reset(c);
    c->active = 1;
    c->t_sent = c->t_connect;  /* a failed connect reports its time from here */
    if (connect(fd, (struct sockaddr *)&x->addr, sizeof x->addr) < 0 && errno != EINPROGRESS)
        die("connect");
    watch(x, c, EPOLL_CTL_ADD, EPOLLOUT);
}

static void record(ctx_t *x, cl_t *c, int ok) {
    c->r.complete = ok;
    c->r.total_ns = now_ns() - c->t_sent;
    x->results[x->nresults++] = c->r;
    c->r.gaps = NULL;
    c->active = 0;
    x->finished++;
}

static void start_request(ctx_t *x, cl_t *c) {
    reset(c);
    c->active = 1;
    c->t_sent = now_ns();
    c->r.connect_ns = 0;
    ssize_t n = send(c->fd, x->req, x->req_len, MSG_NOSIGNAL);
    c->req_off = n > 0 ? (size_t)n : 0;
    watch(x, c, EPOLL_CTL_MOD, c->req_off < x->req_len ? EPOLLOUT : EPOLLIN);
}

/* The response on c ended (ok) or failed; go on with the next request if any is left. */
static void next(ctx_t *x, cl_t *c, int ok) {
    int reuse = ok && x->keep_alive && !c->close_conn && c->phase == P_END;
    int ended = c->phase == P_END || (c->phase == P_EOF);
    int complete = ok && ended && c->r.status == 200 && (!x->stream || c->saw_done);
    record(x, c, complete);
    if (reuse && take(x)) {
        start_request(x, c);
        return;
    }
    epoll_ctl(x->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    if (take(x)) open_conn(x, c);
}

static void on_event(ctx_t *x, cl_t *c, uint32_t ev) {
    if (!c->connected) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err || (ev & (EPOLLERR | EPOLLHUP))) {
            next(x, c, 0);
            return;
        }
        c->connected = 1;
        int64_t connect_ns = now_ns() - c->t_connect;
        start_request(x, c);
        c->r.connect_ns = connect_ns;
        return;
    }
    if (c->req_off < x->req_len) {
        ssize_t n = send(c->fd, x->req + c->req_off, x->req_len - c->req_off, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN) {
            next(x, c, 0);
            return;
        }
        if (n > 0) c->req_off += (size_t)n;
        if (c->req_off == x->req_len) watch(x, c, EPOLL_CTL_MOD, EPOLLIN);
        return;
    }
    char buf[65536];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n > 0) {
            feed(x, c, buf, (size_t)n);
            if (c->phase == P_END) {
                next(x, c, 1);
                return;
            }
            if ((size_t)n < sizeof buf) return;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        /* EOF or error: a close-delimited body ends here; anything else is cut short */
        int ok = n == 0 && c->phase == P_EOF;
        next(x, c, ok);
        return;
    }
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) die("read request");
    fclose(f);
    *len = (size_t)n;
    return p;
}

int main(int argc, char **argv) {
    ctx_t x = {.host = "127.0.0.1", .stream = 1, .total = 1, .concurrency = 1};
    const char *request = NULL, *out = NULL;
    double timeout_s = 300;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(k, "--keep-alive")) { x.keep_alive = 1; continue; }
        i++;
        if (!strcmp(k, "--port")) x.port = atoi(v);
        else if (!strcmp(k, "--host")) x.host = v;
        else if (!strcmp(k, "--request")) request = v;
        else if (!strcmp(k, "--mode")) x.stream = strcmp(v, "latency") != 0;
        else if (!strcmp(k, "--total")) x.total = atol(v);
        else if (!strcmp(k, "--concurrency")) x.concurrency = atoi(v);
        else if (!strcmp(k, "--timeout-s")) timeout_s = atof(v);
        else if (!strcmp(k, "--out")) out = v;
        else {
            fprintf(stderr, "sse_load: unknown option %s\n", k);
            return 2;
        }
    }
    if (!request || x.port <= 0 || x.total < 1 || x.concurrency < 1) {
        fprintf(stderr, "sse_load: --port and --request are required; --total, --concurrency >= 1\n");
        return 2;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    x.req = read_file(request, &x.req_len);
    x.addr.sin_family = AF_INET;
    x.addr.sin_port = htons((uint16_t)x.port);
    if (inet_pton(AF_INET, x.host, &x.addr.sin_addr) != 1) die("inet_pton");
    if (x.concurrency > x.total) x.concurrency = (int)x.total;
    x.results = calloc((size_t)x.total, sizeof *x.results);
    cl_t *cls = calloc((size_t)x.concurrency, sizeof *cls);
    x.ep = epoll_create1(EPOLL_CLOEXEC);
    if (!x.results || !cls || x.ep < 0) die("setup");

    int64_t t0 = now_ns(), deadline = t0 + (int64_t)(timeout_s * 1e9);
    for (int i = 0; i < x.concurrency; i++) {
        take(&x);
        open_conn(&x, &cls[i]);
    }
    struct epoll_event evs[512];
    while (x.finished < x.total) {
        int64_t left = deadline - now_ns();
        if (left <= 0) break;
        int n = epoll_wait(x.ep, evs, 512, (int)(left / 1000000) + 1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) on_event(&x, evs[i].data.ptr, evs[i].events);
    }
    int64_t wall = now_ns() - t0;
    for (int i = 0; i < x.concurrency; i++)  /* timed out: what is still open is incomplete */
        if (cls[i].active) record(&x, &cls[i], 0);

    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) die(out);
    for (long i = 0; i < x.nresults; i++) {
        result_t *r = &x.results[i];
        if (x.stream) {
            fprintf(f, "S %d %d %d %lld %lld %lld", r->complete, r->status, r->events,
                    (long long)(r->connect_ns / 1000), (long long)(r->ttft_ns / 1000),
                    (long long)(r->total_ns / 1000));
            for (int g = 0; g < r->ngaps; g++) fprintf(f, " %d", r->gaps[g]);
            fputc('\n', f);
        } else {
            fprintf(f, "L %d %d %lld\n", r->complete, r->status, (long long)(r->total_ns / 1000));
        }
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long long cpu = (long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000LL +
                    ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
    fprintf(f, "T %lld %lld\n", (long long)(wall / 1000), cpu);
    if (f != stdout) fclose(f);
    return 0;
}
