/*
 * The smallest librdkafka producer application: RECORDS records of SIZE bytes to TOPIC,
 * as fast as librdkafka takes them, then flush. The ingest benchmark's load generator.
 *
 *   rdkafka_producer BOOTSTRAP TOPIC RECORDS SIZE [-W WARMUP_TOPIC] [-X key=value ...]
 *
 * -W (forward_bench's C producer side): first one record to WARMUP_TOPIC, flushed before the
 * clock starts (connections and the idempotent producer id, untimed, as the Python sides do),
 * then "SECONDS CPU_SECONDS" of the timed part (produce of RECORDS until flushed) on stdout.
 *
 * Why not kcat: kcat reads its records line by line from a file and copies each one into
 * librdkafka; on two shared cores that parsing is most of the client's CPU, and the client's
 * CPU caps what any endpoint can take. Here every record points at one payload (no copy, no
 * free) and a delivery report is asked for only on failure, so what remains is librdkafka's
 * own work per record: the cost every real producer pays.
 *
 * Exit status: 0 when every record was acknowledged, 1 on a delivery failure (the first
 * error is printed), 2 on bad arguments or configuration.
 */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long failed;
static char first_error[512];

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *message, void *opaque) {
    (void)rk;
    (void)opaque;
    if (message->err) {
        if (failed++ == 0)
            snprintf(first_error, sizeof first_error, "%s", rd_kafka_err2str(message->err));
    }
}

static double seconds(clockid_t clock) {
    struct timespec now;
    clock_gettime(clock, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

static int set(rd_kafka_conf_t *conf, const char *name, const char *value) {
    char error[512];
    if (rd_kafka_conf_set(conf, name, value, error, sizeof error) != RD_KAFKA_CONF_OK) {
        fprintf(stderr, "rdkafka_producer: %s\n", error);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s BOOTSTRAP TOPIC RECORDS SIZE [-X key=value ...]\n", argv[0]);
        return 2;
    }
    const char *topic = argv[2];
    long records = atol(argv[3]);
    size_t size = (size_t)atol(argv[4]);
    char error[512];
    const char *warmup_topic = NULL;

    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (!set(conf, "bootstrap.servers", argv[1]) || !set(conf, "delivery.report.only.error", "true"))
        return 2;
    for (int i = 5; i < argc; i++) {
        if (strcmp(argv[i], "-W") == 0 && i + 1 < argc) {
            warmup_topic = argv[++i];
            continue;
        }
        if (strcmp(argv[i], "-X") != 0 || i + 1 >= argc || !strchr(argv[i + 1], '=')) {
            fprintf(stderr, "rdkafka_producer: expected -X key=value, got %s\n", argv[i]);
            return 2;
        }
        char *setting = argv[++i];
        char *equals = strchr(setting, '=');
        *equals = '\0';
        if (!set(conf, setting, equals + 1))
            return 2;
    }
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_t *producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, error, sizeof error);
    if (!producer) {
        fprintf(stderr, "rdkafka_producer: %s\n", error);
        return 2;
    }

    char *payload = malloc(size);
    for (size_t i = 0; i < size; i++)
        payload[i] = "0123456789abcdef"[rand() & 15];

    if (warmup_topic) {
        rd_kafka_resp_err_t err = rd_kafka_producev(
            producer, RD_KAFKA_V_TOPIC(warmup_topic), RD_KAFKA_V_VALUE(payload, size),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        if (err || rd_kafka_flush(producer, 60000) != RD_KAFKA_RESP_ERR_NO_ERROR || failed) {
            fprintf(stderr, "rdkafka_producer: the warm-up record was not delivered\n");
            return 1;
        }
    }
    double started = seconds(CLOCK_MONOTONIC);
    double cpu_started = seconds(CLOCK_PROCESS_CPUTIME_ID);
    for (long sent = 0; sent < records;) {
        rd_kafka_resp_err_t err = rd_kafka_producev(
            producer, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_VALUE(payload, size),
            RD_KAFKA_V_MSGFLAGS(0), RD_KAFKA_V_END);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
            sent++;
        else if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL)
            rd_kafka_poll(producer, 1);
        else {
            fprintf(stderr, "rdkafka_producer: produce failed: %s\n", rd_kafka_err2str(err));
            return 1;
        }
    }
    while (rd_kafka_flush(producer, 1000) == RD_KAFKA_RESP_ERR__TIMED_OUT)
        ;
    if (warmup_topic)
        printf("%.6f %.6f\n", seconds(CLOCK_MONOTONIC) - started,
               seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu_started);
    rd_kafka_destroy(producer);
    free(payload);
    if (failed) {
        fprintf(stderr, "rdkafka_producer: %ld records failed, first: %s\n", failed, first_error);
        return 1;
    }
    return 0;
}
