/*
 * redisbench: the Redis side of bench/, shaped like pgbench so that the two compare.
 *
 * N client connections on loopback, spread over J threads; each thread multiplexes its
 * connections with poll(), as pgbench does with -j. A client runs one transaction after
 * another until the time (-T) or the count (-t) is used up. A transaction is:
 *
 *   cycle      SET lock:<random id> <unique value> NX PX <ttl>; when granted, release with
 *              the Lua compare-and-delete of the article (EVAL)
 *   contended  the same on the one key "hot"
 *   renew      EVAL compare-and-PEXPIRE on hb:<random id> (a lease held by "hb")
 *   fenced     EVAL compare-and-set of a fence token on the hash res:<random id>
 *
 * Plain RESP over a socket, no client library. Prints one JSON object: counts, throughput,
 * latency percentiles of whole transactions, and per-client successes (for Jain's index).
 * Any error reply or unexpected answer is counted and makes the exit status 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *DEL_LUA =
    "if redis.call(\"GET\", KEYS[1]) == ARGV[1] then\n"
    "  return redis.call(\"DEL\", KEYS[1])\n"
    "else\n"
    "  return 0\n"
    "end";
static const char *RENEW_LUA =
    "if redis.call(\"GET\", KEYS[1]) == ARGV[1] then\n"
    "  return redis.call(\"PEXPIRE\", KEYS[1], ARGV[2])\n"
    "else\n"
    "  return 0\n"
    "end";
static const char *FENCE_LUA =
    "local t = tonumber(redis.call(\"HGET\", KEYS[1], \"t\"))\n"
    "if t == nil or tonumber(ARGV[1]) >= t then\n"
    "  redis.call(\"HSET\", KEYS[1], \"t\", ARGV[1], \"d\", ARGV[2])\n"
    "  return 1\n"
    "end\n"
    "return 0";

enum workload { CYCLE, CONTENDED, RENEW, FENCED };

static enum workload wl = CYCLE;
static int nclients = 1, nthreads = 1, port = 6379, keys = 100000, ttl_ms = 30000;
static double seconds = 5;
static long max_tx = 0; /* -t: transactions per client; 0 = run for -T seconds */
static const char *latency_file; /* -l: every transaction's latency in us, one a line */
static double deadline;

struct client {
    int id, fd, phase; /* phase 0 idle, 1 waiting for SET or the single command, 2 for EVAL */
    long done, ok, errors;
    unsigned long long rng, seq;
    char key[64], val[64];
    double start;
    char buf[512];
    int blen;
};

struct thread {
    pthread_t th;
    struct client *clients;
    int n;
    float *lat; /* microseconds */
    long nlat, cap;
    double last_end;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static unsigned long long xorshift(unsigned long long *s)
{
    unsigned long long x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void die(const char *what)
{
    perror(what);
    exit(2);
}

/* Sends one command, given as argc strings, in RESP. Commands are small: loopback
 * takes them whole, but loop on short writes all the same. */
static void send_cmd(int fd, int argc, const char **argv)
{
    char out[2048];
    int len = snprintf(out, sizeof out, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++) {
        int l = (int)strlen(argv[i]);
        if (len + l + 32 > (int)sizeof out) {
            fprintf(stderr, "command too long\n");
            exit(2);
        }
        len += snprintf(out + len, sizeof out - len, "$%d\r\n%s\r\n", l, argv[i]);
    }
    for (int off = 0; off < len;) {
        ssize_t w = write(fd, out + off, len - off);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            die("write");
        }
        off += (int)w;
    }
}

static void begin_tx(struct client *c)
{
    char ttl[32], tok[32];
    c->start = now();
    c->blen = 0;
    switch (wl) {
    case CYCLE:
    case CONTENDED:
        if (wl == CYCLE)
            snprintf(c->key, sizeof c->key, "lock:%llu", xorshift(&c->rng) % keys + 1);
        else
            snprintf(c->key, sizeof c->key, "hot");
        snprintf(c->val, sizeof c->val, "bench:%d:%llu", c->id, ++c->seq);
        snprintf(ttl, sizeof ttl, "%d", ttl_ms);
        send_cmd(c->fd, 6, (const char *[]){"SET", c->key, c->val, "NX", "PX", ttl});
        break;
    case RENEW:
        snprintf(c->key, sizeof c->key, "hb:%llu", xorshift(&c->rng) % keys + 1);
        snprintf(ttl, sizeof ttl, "%d", ttl_ms);
        send_cmd(c->fd, 6, (const char *[]){"EVAL", RENEW_LUA, "1", c->key, "hb", ttl});
        break;
    case FENCED:
        snprintf(c->key, sizeof c->key, "res:%llu", xorshift(&c->rng) % keys + 1);
        snprintf(tok, sizeof tok, "%d", 1000);
        send_cmd(c->fd, 6, (const char *[]){"EVAL", FENCE_LUA, "1", c->key, tok, "{\"n\": 1}"});
        break;
    }
    c->phase = 1;
}

static void end_tx(struct thread *t, struct client *c, int ok)
{
    double end = now();
    if (t->nlat == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 65536;
        t->lat = realloc(t->lat, t->cap * sizeof *t->lat);
        if (!t->lat) die("realloc");
    }
    t->lat[t->nlat++] = (float)((end - c->start) * 1e6);
    t->last_end = end;
    c->done++;
    c->ok += ok;
    c->phase = 0;
}

/* One whole reply line is in c->buf: act on it. Every reply we expect is one line. */
static void on_reply(struct thread *t, struct client *c, const char *line)
{
    if (line[0] == '-') {
        fprintf(stderr, "client %d: redis error: %s\n", c->id, line);
        c->errors++;
        end_tx(t, c, 0);
        return;
    }
    if (c->phase == 1 && (wl == CYCLE || wl == CONTENDED)) {
        if (strcmp(line, "+OK") == 0) {
            send_cmd(c->fd, 5, (const char *[]){"EVAL", DEL_LUA, "1", c->key, c->val});
            c->phase = 2;
        } else if (strcmp(line, "$-1") == 0) {
            end_tx(t, c, 0); /* held by someone else */
        } else {
            fprintf(stderr, "client %d: unexpected SET reply %s\n", c->id, line);
            c->errors++;
            end_tx(t, c, 0);
        }
        return;
    }
    if (c->phase == 2) { /* the release must find our own value */
        if (strcmp(line, ":1") != 0) {
            fprintf(stderr, "client %d: release of %s answered %s\n", c->id, c->key, line);
            c->errors++;
        }
        end_tx(t, c, 1);
        return;
    }
    /* renew / fenced: 1 = done, 0 = refused (the lease or token did not match) */
    if (strcmp(line, ":1") == 0) {
        end_tx(t, c, 1);
    } else {
        fprintf(stderr, "client %d: %s on %s answered %s\n", c->id,
                wl == RENEW ? "renew" : "fenced write", c->key, line);
        c->errors++;
        end_tx(t, c, 0);
    }
}

static int more(struct client *c)
{
    return max_tx ? c->done < max_tx : now() < deadline;
}

static void *run_thread(void *arg)
{
    struct thread *t = arg;
    struct pollfd *pfd = calloc(t->n, sizeof *pfd);
    for (int i = 0; i < t->n; i++) begin_tx(&t->clients[i]);
    for (;;) {
        int active = 0;
        for (int i = 0; i < t->n; i++) {
            pfd[i].fd = t->clients[i].phase ? t->clients[i].fd : -1;
            pfd[i].events = POLLIN;
            active += t->clients[i].phase != 0;
        }
        if (!active) break;
        int r = poll(pfd, t->n, 1000);
        if (r < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        for (int i = 0; i < t->n; i++) {
            struct client *c = &t->clients[i];
            if (!(pfd[i].revents & (POLLIN | POLLERR | POLLHUP))) continue;
            ssize_t got = read(c->fd, c->buf + c->blen, sizeof c->buf - 1 - c->blen);
            if (got <= 0) {
                fprintf(stderr, "client %d: connection lost\n", c->id);
                exit(2);
            }
            c->blen += (int)got;
            c->buf[c->blen] = 0;
            char *eol = strstr(c->buf, "\r\n");
            if (!eol) continue;
            *eol = 0;
            char line[512];
            snprintf(line, sizeof line, "%s", c->buf);
            c->blen = 0;
            on_reply(t, c, line);
            if (c->phase == 0 && more(c)) begin_tx(c);
        }
    }
    free(pfd);
    return NULL;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void usage(void)
{
    fprintf(stderr, "usage: redisbench -w cycle|contended|renew|fenced [-c clients] [-j threads] "
                    "[-T seconds | -t tx-per-client] [-p port] [-k keys] [-x ttl-ms] [-l latency-file]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int opt;
    while ((opt = getopt(argc, argv, "w:c:j:T:t:p:k:x:l:")) != -1) {
        switch (opt) {
        case 'w':
            if (!strcmp(optarg, "cycle")) wl = CYCLE;
            else if (!strcmp(optarg, "contended")) wl = CONTENDED;
            else if (!strcmp(optarg, "renew")) wl = RENEW;
            else if (!strcmp(optarg, "fenced")) wl = FENCED;
            else usage();
            break;
        case 'c': nclients = atoi(optarg); break;
        case 'j': nthreads = atoi(optarg); break;
        case 'T': seconds = atof(optarg); break;
        case 't': max_tx = atol(optarg); break;
        case 'p': port = atoi(optarg); break;
        case 'k': keys = atoi(optarg); break;
        case 'x': ttl_ms = atoi(optarg); break;
        case 'l': latency_file = optarg; break;
        default: usage();
        }
    }
    if (nclients < 1 || nclients > 1024 || keys < 1 || seconds <= 0 || seconds > 3600) usage();
    if (nthreads < 1) nthreads = 1;
    if (nthreads > nclients) nthreads = nclients;

    struct client *clients = calloc(nclients, sizeof *clients);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr); /* loopback only */
    for (int i = 0; i < nclients; i++) {
        struct client *c = &clients[i];
        c->id = i;
        c->rng = 0x9E3779B97F4A7C15ULL * (i + 1) ^ (unsigned long long)time(NULL);
        if (!c->rng) c->rng = 1;
        c->fd = socket(AF_INET, SOCK_STREAM, 0);
        if (c->fd < 0) die("socket");
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0) die("connect");
    }

    struct thread *threads = calloc(nthreads, sizeof *threads);
    for (int t = 0; t < nthreads; t++) {
        threads[t].clients = calloc(nclients, sizeof(struct client));
    }
    /* client i runs on thread i % J; copy it there, gather the counts back afterwards */
    for (int i = 0; i < nclients; i++) {
        struct thread *t = &threads[i % nthreads];
        t->clients[t->n++] = clients[i];
    }
    double start = now();
    deadline = start + seconds;
    for (int t = 0; t < nthreads; t++)
        if (pthread_create(&threads[t].th, NULL, run_thread, &threads[t])) die("pthread_create");
    long total = 0, ok = 0, errors = 0, nlat = 0;
    double last_end = start;
    for (int t = 0; t < nthreads; t++) {
        pthread_join(threads[t].th, NULL);
        nlat += threads[t].nlat;
        if (threads[t].last_end > last_end) last_end = threads[t].last_end;
    }
    float *lat = malloc((nlat ? nlat : 1) * sizeof *lat);
    long k = 0;
    for (int t = 0; t < nthreads; t++) {
        memcpy(lat + k, threads[t].lat, threads[t].nlat * sizeof *lat);
        k += threads[t].nlat;
        for (int i = 0; i < threads[t].n; i++) {
            struct client *c = &threads[t].clients[i];
            clients[c->id] = *c;
        }
    }
    if (latency_file) {
        FILE *f = fopen(latency_file, "w");
        if (!f) die(latency_file);
        for (long i = 0; i < nlat; i++) fprintf(f, "%.1f\n", lat[i]);
        if (fclose(f)) die(latency_file);
    }
    qsort(lat, nlat, sizeof *lat, cmp_float);
    double sum = 0;
    for (long i = 0; i < nlat; i++) sum += lat[i];
    double elapsed = last_end - start;
    printf("{\"transactions\": %ld", nlat);
    for (int i = 0; i < nclients; i++) {
        total += clients[i].done;
        ok += clients[i].ok;
        errors += clients[i].errors;
    }
    printf(", \"ok\": %ld, \"errors\": %ld, \"seconds\": %.6f, \"tps\": %.3f", ok, errors, elapsed,
           elapsed > 0 ? total / elapsed : 0.0);
    printf(", \"ok_per_s\": %.3f", elapsed > 0 ? ok / elapsed : 0.0);
    if (nlat) {
        printf(", \"mean_ms\": %.4f, \"p50_ms\": %.4f, \"p99_ms\": %.4f", sum / nlat / 1000.0,
               lat[(long)(0.50 * (nlat - 1))] / 1000.0, lat[(long)(0.99 * (nlat - 1))] / 1000.0);
    }
    printf(", \"per_client_ok\": [");
    for (int i = 0; i < nclients; i++) printf("%s%ld", i ? ", " : "", clients[i].ok);
    printf("]}\n");
    return errors ? 1 : 0;
}
