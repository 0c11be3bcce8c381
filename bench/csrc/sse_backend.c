/* sse_backend: a paced OpenAI-compatible SSE backend that costs almost no CPU.
 *
 * The C twin of `vllm-sim --tokens N --itl-ms T` for the relay benchmark (bench/relay.py
 * --harness c): one thread, epoll, one timerfd driven by a binary heap of stream deadlines,
 * HTTP/1.1 keep-alive. It writes the same bytes as the Python simulator's paced mode
 * (vllm_sim/render.py chat_stream, vllm_sim/wire.py SseWriter):
 *
 *   POST /v1/chat/completions, "stream": true
 *       200, Transfer-Encoding: chunked, one chunk per SSE event "data: <json>\n\n":
 *       a delta.role event and the first token at once (after --ttft-ms), then one
 *       chat.completion.chunk per token every --itl-ms on an absolute schedule (no drift),
 *       the last carrying finish_reason; with stream_options.include_usage a usage chunk
 *       ("choices": []) right after the last token; then "data: [DONE]" and the last chunk.
 *   POST /v1/chat/completions, otherwise: a chat.completion JSON (Content-Length) after
 *       --ttft-ms + (tokens - 1) * --itl-ms.
 *   GET /health (200, empty), /v1/models, /metrics (vllm:num_requests_running/waiting,
 *   vllm:kv_cache_usage_perc), /sim/stats ({"running": n}).
 *
 * Tokens per response: --tokens, cut short by the request's max_tokens or
 * max_completion_tokens (finish_reason "length" then, "stop" otherwise), as vllm-sim does.
 * Request bodies may be Content-Length or chunked. The JSON fields it needs (model, stream,
 * max_tokens, include_usage, message contents) are found by a plain scan, not a JSON parser:
 * a benchmark backend, not a validating server.
 *
 * Deadlines are served by one timer rounded up to --timer-slack-ms (1 ms; 0 = exact): at 512
 * streams 20 ms apart one wake-up sends ~25 events instead of one, so the backend's CPU is
 * mostly the send(2) per event; an event is late by less than the slack.
 *
 * Usage: sse_backend --port P [--host 127.0.0.1] [--model m] [--tokens 16] [--itl-ms 0]
 *                    [--ttft-ms 0] [--timer-slack-ms 1]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

static const char *TOKENS[] = {"Hello", ",", " this", " is", " the", " vLLM", " simulator", ":",
                               " caf\xc3\xa9", " na\xc3\xafve", " \xe6\x97\xa5\xe6\x9c\xac",
                               "\xe8\xaa\x9e", " \xf0\x9f\x9a\x80", " \xe2\x9c\x93",
                               " \xc3\xbc" "ber", "."};
#define NTOKENS ((int)(sizeof TOKENS / sizeof TOKENS[0]))
#define MAX_REQ (1 << 20)

typedef struct {
    char *p;
    size_t len, off, cap;
} buf_t;

typedef struct {
    int fd, open, streaming, pending;  /* pending: a non-streamed answer waits for its timer */
    uint32_t gen;
    buf_t in, out;
    int close_after, want_out;
    /* the stream in progress */
    int tokens, sent, include_usage, prompt_tokens, length_cut;
    int64_t next_ns;
    char rid[40], model[128];
    long created;
} conn_t;

typedef struct {
    int64_t at;
    int fd;
    uint32_t gen;
} timer_t_;

typedef struct {
    const char *model;
    int tokens;
    int64_t itl_ns, ttft_ns, slack_ns;
    long started;
    int ep, tfd;
    conn_t **conns;
    int nconns;
    timer_t_ *heap;
    int hlen, hcap;
    int64_t armed;
    uint64_t seq;
    int running;
    uint32_t gens;
} server_t;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void buf_reserve(buf_t *b, size_t extra) {
    if (b->len + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    b->p = realloc(b->p, cap);
    if (!b->p) die("realloc");
    b->cap = cap;
}

static void buf_add(buf_t *b, const char *s, size_t n) {
    buf_reserve(b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void buf_printf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(buf_t *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) die("vsnprintf");
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        buf_reserve(b, (size_t)n + 1);
    }
}

/* ---- timer heap (min-heap on deadline) ---- */

static void heap_push(server_t *s, int64_t at, int fd, uint32_t gen) {
    if (s->hlen == s->hcap) {
        s->hcap = s->hcap ? s->hcap * 2 : 1024;
        s->heap = realloc(s->heap, (size_t)s->hcap * sizeof *s->heap);
        if (!s->heap) die("realloc");
    }
    int i = s->hlen++;
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (s->heap[parent].at <= at) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = (timer_t_){at, fd, gen};
}

static timer_t_ heap_pop(server_t *s) {
    timer_t_ top = s->heap[0], last = s->heap[--s->hlen];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= s->hlen) break;
        if (c + 1 < s->hlen && s->heap[c + 1].at < s->heap[c].at) c++;
        if (last.at <= s->heap[c].at) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->hlen) s->heap[i] = last;
    return top;
}

static void arm(server_t *s) {
    int64_t at = s->hlen ? s->heap[0].at : 0;
    if (at && s->slack_ns)  /* one wake-up serves every deadline of the slack window */
        at = (at + s->slack_ns - 1) / s->slack_ns * s->slack_ns;
    if (at == s->armed) return;
    struct itimerspec its = {0};
    if (at) {
        its.it_value.tv_sec = at / 1000000000LL;
        its.it_value.tv_nsec = at % 1000000000LL;
    }
    if (timerfd_settime(s->tfd, TFD_TIMER_ABSTIME, &its, NULL) < 0) die("timerfd_settime");
    s->armed = at;
}

/* ---- connections ---- */

static void set_events(server_t *s, conn_t *c) {
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (c->want_out ? EPOLLOUT : 0),
                             .data.fd = c->fd};
    if (epoll_ctl(s->ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl mod");
}

static void conn_close(server_t *s, conn_t *c) {
    if (c->streaming || c->pending) s->running--;
    epoll_ctl(s->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    s->conns[c->fd] = NULL;
    free(c->in.p);
    free(c->out.p);
    free(c);
}

/* Write what is queued; returns 0, or -1 when the connection was closed. */
static int flush(server_t *s, conn_t *c) {
    while (c->out.off < c->out.len) {
        ssize_t n = send(c->fd, c->out.p + c->out.off, c->out.len - c->out.off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out.off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!c->want_out) {
                c->want_out = 1;
                set_events(s, c);
            }
            return 0;
        }
        conn_close(s, c);
        return -1;
    }
    c->out.off = c->out.len = 0;
    if (c->want_out) {
        c->want_out = 0;
        set_events(s, c);
    }
    if (c->close_after && !c->streaming && !c->pending) {
        conn_close(s, c);
        return -1;
    }
    return 0;
}

static void head(conn_t *c, int status, const char *reason, const char *ctype, long length) {
    buf_printf(&c->out, "HTTP/1.1 %d %s\r\n", status, reason);
    if (ctype) buf_printf(&c->out, "content-type: %s\r\n", ctype);
    buf_printf(&c->out, "x-simulator: sse-backend\r\n");
    if (length >= 0)
        buf_printf(&c->out, "content-length: %ld\r\n", length);
    else
        buf_printf(&c->out, "transfer-encoding: chunked\r\n");
    if (c->close_after) buf_printf(&c->out, "connection: close\r\n");
    buf_add(&c->out, "\r\n", 2);
}

static void respond(conn_t *c, int status, const char *reason, const char *ctype,
                    const char *body, size_t len) {
    head(c, status, reason, ctype, (long)len);
    buf_add(&c->out, body, len);
}

static void error_json(conn_t *c, int status, const char *reason, const char *msg) {
    char body[512];
    int n = snprintf(body, sizeof body,
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":%d}}",
                     msg, status == 404 ? "NotFoundError" : "BadRequestError", status);
    respond(c, status, reason, "application/json", body, (size_t)n);
}

/* One SSE event as one HTTP chunk. */
static void sse_event(conn_t *c, const char *payload, size_t len) {
    buf_printf(&c->out, "%zx\r\ndata: ", len + 8);
    buf_add(&c->out, payload, len);
    buf_add(&c->out, "\n\n\r\n", 4);
}

static size_t token_event(conn_t *c, char *dst, size_t cap, int step) {
    int last = step == c->tokens - 1;
    return (size_t)snprintf(
        dst, cap,
        "{\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%ld,\"model\":\"%s\","
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"},\"logprobs\":null,"
        "\"finish_reason\":%s,\"token_ids\":null}]}",
        c->rid, c->created, c->model, TOKENS[step % NTOKENS],
        !last ? "null" : c->length_cut ? "\"length\",\"stop_reason\":null"
                                       : "\"stop\",\"stop_reason\":null");
}

static void stream_tail(conn_t *c) {
    char ev[1024];
    if (c->include_usage) {
        size_t n = (size_t)snprintf(
            ev, sizeof ev,
            "{\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%ld,\"model\":\"%s\","
            "\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d,"
            "\"completion_tokens\":%d},\"system_fingerprint\":\"vllm-sim\"}",
            c->rid, c->created, c->model, c->prompt_tokens, c->prompt_tokens + c->tokens,
            c->tokens);
        sse_event(c, ev, n);
    }
    sse_event(c, "[DONE]", 6);
    buf_add(&c->out, "0\r\n\r\n", 5);
}

static void stream_start(server_t *s, conn_t *c) {
    char ev[1024];
    head(c, 200, "OK", "text/event-stream; charset=utf-8", -1);
    size_t n = (size_t)snprintf(
        ev, sizeof ev,
        "{\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"created\":%ld,\"model\":\"%s\","
        "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
        "\"logprobs\":null,\"finish_reason\":null}],\"prompt_token_ids\":null,"
        "\"prompt_text\":null}",
        c->rid, c->created, c->model);
    sse_event(c, ev, n);
    sse_event(c, ev, token_event(c, ev, sizeof ev, 0));
    c->sent = 1;
    if (c->sent == c->tokens || s->itl_ns == 0) {
        for (; c->sent < c->tokens; c->sent++)
            sse_event(c, ev, token_event(c, ev, sizeof ev, c->sent));
        stream_tail(c);
        c->streaming = 0;
        s->running--;
        return;
    }
    c->next_ns += s->itl_ns;
    heap_push(s, c->next_ns, c->fd, c->gen);
}

static void answer_json(server_t *s, conn_t *c) {
    char text[8192], body[12288];
    size_t tl = 0;
    for (int i = 0; i < c->tokens && tl + 16 < sizeof text; i++) {
        size_t n = strlen(TOKENS[i % NTOKENS]);
        memcpy(text + tl, TOKENS[i % NTOKENS], n);
        tl += n;
    }
    text[tl] = 0;
    int n = snprintf(
        body, sizeof body,
        "{\"id\":\"%s\",\"object\":\"chat.completion\",\"created\":%ld,\"model\":\"%s\","
        "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"%s\","
        "\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,"
        "\"reasoning\":null},\"logprobs\":null,\"finish_reason\":\"%s\",\"stop_reason\":null,"
        "\"token_ids\":null}],\"service_tier\":null,\"system_fingerprint\":\"vllm-sim\","
        "\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d,\"completion_tokens\":%d,"
        "\"prompt_tokens_details\":null,\"completion_tokens_details\":null},"
        "\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"kv_transfer_params\":null}",
        c->rid, c->created, c->model, text, c->length_cut ? "length" : "stop", c->prompt_tokens,
        c->prompt_tokens + c->tokens, c->tokens);
    respond(c, 200, "OK", "application/json", body, (size_t)n);
    c->pending = 0;
    s->running--;
}

/* ---- the request ---- */

/* The value after "key": in a JSON text (not preceded by a backslash), or NULL. */
static const char *json_value(const char *body, size_t len, const char *key) {
    char pat[64];
    int pl = snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *end = body + len, *p = body;
    while ((p = memmem(p, (size_t)(end - p), pat, (size_t)pl)) != NULL) {
        const char *q = p + pl;
        int escaped = p > body && p[-1] == '\\';
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')) q++;
        if (!escaped && q < end && *q == ':') {
            q++;
            while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')) q++;
            return q;
        }
        p += pl;
    }
    return NULL;
}

static int is_word(unsigned char ch) {
    return ch >= 0x80 || ch == '_' || (ch >= '0' && ch <= '9') || ((ch | 32) >= 'a' && (ch | 32) <= 'z');
}

/* Token pieces of every "content" string (vllm_sim.tokens.split_pieces, ASCII classes). */
static int prompt_tokens(const char *body, size_t len) {
    int count = 0;
    const char *end = body + len, *p = body;
    while ((p = json_value(p, (size_t)(end - p), "content")) != NULL) {
        if (*p != '"') continue;
        p++;
        int in_word = 0, pending_space = 0;
        while (p < end && *p != '"') {
            unsigned char ch = (unsigned char)*p;
            if (ch == '\\' && p + 1 < end) {
                p += 2;
                in_word = 0;
                count++;
                continue;
            }
            if (ch == ' ' || ch == '\t') {
                in_word = 0;
                pending_space = 1;
            } else if (is_word(ch)) {
                if (!in_word) count++;
                in_word = 1;
                pending_space = 0;
            } else {
                count++;
                in_word = 0;
                pending_space = 0;
            }
            p++;
        }
        count += pending_space;
    }
    return count;
}

static void chat(server_t *s, conn_t *c, const char *body, size_t len) {
    const char *v = json_value(body, len, "model");
    size_t ml = 0;
    if (v && *v == '"') {
        const char *q = memchr(v + 1, '"', (size_t)(body + len - v - 1));
        if (q) ml = (size_t)(q - v - 1);
    }
    if (!ml || ml >= sizeof c->model || ml != strlen(s->model) || memcmp(v + 1, s->model, ml)) {
        error_json(c, 404, "Not Found", "The model does not exist.");
        return;
    }
    memcpy(c->model, v + 1, ml);
    c->model[ml] = 0;
    v = json_value(body, len, "stream");
    int stream = v && !strncmp(v, "true", 4);
    v = json_value(body, len, "include_usage");
    c->include_usage = v && !strncmp(v, "true", 4);
    v = json_value(body, len, "max_completion_tokens");
    if (!v || *v == 'n') v = json_value(body, len, "max_tokens");
    long max_tokens = v && *v >= '0' && *v <= '9' ? strtol(v, NULL, 10) : -1;
    if (max_tokens == 0) {
        error_json(c, 400, "Bad Request", "max_tokens must be at least 1");
        return;
    }
    c->tokens = s->tokens;
    c->length_cut = 0;
    if (max_tokens > 0 && max_tokens < s->tokens) {
        c->tokens = (int)max_tokens;
        c->length_cut = 1;
    }
    c->prompt_tokens = prompt_tokens(body, len);
    snprintf(c->rid, sizeof c->rid, "chatcmpl-%016llx",
             (unsigned long long)(++s->seq * 0x9E3779B97F4A7C15ULL));
    c->created = (long)time(NULL);
    s->running++;
    c->gen = ++s->gens;
    int64_t now = now_ns();
    if (stream) {
        c->streaming = 1;
        c->next_ns = now + s->ttft_ns;
        if (s->ttft_ns) {
            c->sent = 0;
            heap_push(s, c->next_ns, c->fd, c->gen);
        } else {
            stream_start(s, c);
        }
        return;
    }
    int64_t wait = s->ttft_ns + s->itl_ns * (c->tokens - 1);
    if (!wait) {
        c->pending = 1;
        answer_json(s, c);
        return;
    }
    c->pending = 1;
    heap_push(s, now + wait, c->fd, c->gen);
}

static void models(server_t *s, conn_t *c) {
    char body[1024];
    int n = snprintf(
        body, sizeof body,
        "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\",\"created\":%ld,"
        "\"owned_by\":\"vllm-sim\",\"root\":\"%s\",\"parent\":null,\"max_model_len\":100000,"
        "\"permission\":[]}]}",
        s->model, s->started, s->model);
    respond(c, 200, "OK", "application/json", body, (size_t)n);
}

static void metrics(server_t *s, conn_t *c) {
    char body[1024];
    int n = snprintf(body, sizeof body,
                     "# TYPE vllm:num_requests_running gauge\n"
                     "vllm:num_requests_running{engine=\"0\",model_name=\"%s\"} %d.0\n"
                     "# TYPE vllm:num_requests_waiting gauge\n"
                     "vllm:num_requests_waiting{engine=\"0\",model_name=\"%s\"} 0.0\n"
                     "# TYPE vllm:kv_cache_usage_perc gauge\n"
                     "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"%s\"} 0.0\n",
                     s->model, s->running, s->model, s->model);
    respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", body, (size_t)n);
}

/* Decode a chunked body in place; returns its length, -1 if incomplete, -2 if malformed. */
static long dechunk(char *p, size_t len, size_t *consumed) {
    size_t r = 0, w = 0;
    for (;;) {
        char *eol = memmem(p + r, len - r, "\r\n", 2);
        if (!eol) return -1;
        char *hex_end;
        unsigned long size = strtoul(p + r, &hex_end, 16);
        if (hex_end == p + r) return -2;
        r = (size_t)(eol - p) + 2;
        if (size == 0) {
            char *fin = memmem(p + r, len - r, "\r\n", 2);  /* no trailers expected */
            if (!fin) return -1;
            *consumed = (size_t)(fin - p) + 2;
            return (long)w;
        }
        if (len - r < size + 2) return -1;
        memmove(p + w, p + r, size);
        w += size;
        r += size + 2;
    }
}

/* Parse and answer the complete requests in c->in; returns -1 when c was closed. */
static int handle_input(server_t *s, conn_t *c) {
    while (!c->streaming && !c->pending && c->in.len) {
        char *p = c->in.p;
        char *hend = memmem(p, c->in.len, "\r\n\r\n", 4);
        if (!hend) {
            if (c->in.len > MAX_REQ) {
                conn_close(s, c);
                return -1;
            }
            break;
        }
        size_t hlen = (size_t)(hend - p) + 4;
        long clen = 0;
        int chunked = 0;
        c->close_after = 0;
        /* every header line ends in \n before hend + 2 (hend is the final \r\n\r\n) */
        for (char *line = (char *)memchr(p, '\n', hlen) + 1; line < hend;
             line = (char *)memchr(line, '\n', (size_t)(hend - line) + 2) + 1) {
            if (!strncasecmp(line, "content-length:", 15)) clen = strtol(line + 15, NULL, 10);
            else if (!strncasecmp(line, "transfer-encoding:", 18)) chunked = 1;
            else if (!strncasecmp(line, "connection:", 11)) {
                const char *v = line + 11;
                while (*v == ' ') v++;
                c->close_after = !strncasecmp(v, "close", 5);
            }
        }
        char *body = p + hlen;
        size_t blen, used;
        if (chunked) {
            long n = dechunk(body, c->in.len - hlen, &used);
            if (n == -1) break;
            if (n < 0) {
                conn_close(s, c);
                return -1;
            }
            blen = (size_t)n;
            used += hlen;
        } else {
            if (c->in.len - hlen < (size_t)clen) break;
            blen = (size_t)clen;
            used = hlen + blen;
        }
        if (!strncmp(p, "POST /v1/chat/completions ", 26)) chat(s, c, body, blen);
        else if (!strncmp(p, "GET /health ", 11)) respond(c, 200, "OK", NULL, "", 0);
        else if (!strncmp(p, "GET /v1/models ", 15)) models(s, c);
        else if (!strncmp(p, "GET /metrics ", 13)) metrics(s, c);
        else if (!strncmp(p, "GET /sim/stats ", 15)) {
            char b[64];
            int n = snprintf(b, sizeof b, "{\"running\":%d}", s->running);
            respond(c, 200, "OK", "application/json", b, (size_t)n);
        } else error_json(c, 404, "Not Found", "Not Found");
        memmove(c->in.p, c->in.p + used, c->in.len - used);
        c->in.len -= used;
    }
    return flush(s, c);
}

static void on_readable(server_t *s, conn_t *c) {
    for (;;) {
        buf_reserve(&c->in, 16384);
        ssize_t n = recv(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len, 0);
        if (n > 0) {
            c->in.len += (size_t)n;
            if ((size_t)n < c->in.cap - c->in.len + (size_t)n) break;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        conn_close(s, c);  /* EOF or error: the client went, its stream ends */
        return;
    }
    handle_input(s, c);
}

static void on_timer(server_t *s) {
    uint64_t expirations;
    if (read(s->tfd, &expirations, sizeof expirations) < 0 && errno != EAGAIN) die("read timerfd");
    s->armed = 0;
    int64_t now = now_ns();
    char ev[1024];
    while (s->hlen && s->heap[0].at <= now) {
        timer_t_ t = heap_pop(s);
        conn_t *c = t.fd < s->nconns ? s->conns[t.fd] : NULL;
        if (!c || c->gen != t.gen) continue;  /* the connection went: a stale deadline */
        if (c->pending) {
            answer_json(s, c);
        } else if (c->streaming && c->sent == 0) {
            stream_start(s, c);
        } else if (c->streaming) {
            sse_event(c, ev, token_event(c, ev, sizeof ev, c->sent));
            if (++c->sent == c->tokens) {
                stream_tail(c);
                c->streaming = 0;
                s->running--;
            } else {
                c->next_ns += s->itl_ns;
                heap_push(s, c->next_ns, c->fd, c->gen);
            }
        }
        if (flush(s, c) == 0 && !c->streaming && !c->pending && c->in.len) handle_input(s, c);
    }
    arm(s);
}

static void on_accept(server_t *s, int lfd) {
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (fd >= s->nconns) {
            int n = s->nconns;
            while (n <= fd) n *= 2;
            s->conns = realloc(s->conns, (size_t)n * sizeof *s->conns);
            if (!s->conns) die("realloc");
            memset(s->conns + s->nconns, 0, (size_t)(n - s->nconns) * sizeof *s->conns);
            s->nconns = n;
        }
        conn_t *c = calloc(1, sizeof *c);
        if (!c) die("calloc");
        c->fd = fd;
        c->open = 1;
        s->conns[fd] = c;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = fd};
        if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl add");
    }
}

static volatile sig_atomic_t stop;
static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv) {
    server_t s = {.model = "m", .tokens = 16, .nconns = 1024, .slack_ns = 1000000};
    const char *host = "127.0.0.1";
    int port = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--port")) port = atoi(v);
        else if (!strcmp(k, "--host")) host = v;
        else if (!strcmp(k, "--model")) s.model = v;
        else if (!strcmp(k, "--tokens")) s.tokens = atoi(v);
        else if (!strcmp(k, "--itl-ms")) s.itl_ns = (int64_t)(atof(v) * 1e6);
        else if (!strcmp(k, "--ttft-ms")) s.ttft_ns = (int64_t)(atof(v) * 1e6);
        else if (!strcmp(k, "--timer-slack-ms")) s.slack_ns = (int64_t)(atof(v) * 1e6);
        else {
            fprintf(stderr, "sse_backend: unknown option %s\n", k);
            return 2;
        }
    }
    if (s.tokens < 1 || strlen(s.model) >= 128) {
        fprintf(stderr, "sse_backend: --tokens must be >= 1, --model under 128 bytes\n");
        return 2;
    }
    s.started = (long)time(NULL);
    s.conns = calloc((size_t)s.nconns, sizeof *s.conns);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) die("inet_pton");
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0) die("bind");
    if (listen(lfd, 4096) < 0) die("listen");
    socklen_t al = sizeof addr;
    getsockname(lfd, (struct sockaddr *)&addr, &al);
    printf("sse_backend listening on %s:%d\n", host, ntohs(addr.sin_port));
    fflush(stdout);

    s.ep = epoll_create1(EPOLL_CLOEXEC);
    s.tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (s.ep < 0 || s.tfd < 0) die("epoll/timerfd");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(s.ep, EPOLL_CTL_ADD, lfd, &ev);
    ev.data.fd = s.tfd;
    epoll_ctl(s.ep, EPOLL_CTL_ADD, s.tfd, &ev);

    struct epoll_event evs[256];
    while (!stop) {
        int n = epoll_wait(s.ep, evs, 256, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd) {
                on_accept(&s, lfd);
            } else if (fd == s.tfd) {
                on_timer(&s);
            } else {
                conn_t *c = fd < s.nconns ? s.conns[fd] : NULL;
                if (!c) continue;
                if (evs[i].events & EPOLLOUT) {
                    if (flush(&s, c) < 0) continue;
                    if (!c->streaming && !c->pending && c->in.len && handle_input(&s, c) < 0)
                        continue;
                }
                if (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) on_readable(&s, c);
            }
        }
        arm(&s);
    }
    return 0;
}
