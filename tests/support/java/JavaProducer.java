import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReferenceArray;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Produces records with the Apache Kafka Java client (kafka-clients) and prints what happened
 * as JSON: the tests' Java producer (tests/support/java_client.py compiles and runs it).
 *
 * <pre>java -cp CLASSES:LIBS/* JavaProducer MODE SETTINGS_FILE [RECORDS_FILE]</pre>
 *
 * SETTINGS_FILE is a properties file: every key is a producer setting (bootstrap.servers,
 * compression.type, transactional.id...), except those starting with "harness.", which the
 * program reads itself: harness.rate (records a second; 0 or absent: as fast as possible) and
 * harness.close.timeout.ms.
 *
 * RECORDS_FILE holds one record a line, six tab-separated fields: topic, partition ("-": the
 * partitioner's choice), timestamp in ms ("-": the producer's clock), key, value, headers. Keys,
 * values and header values are base64 ("-" is null, "" empty); headers are comma-separated
 * "base64(name):value" pairs, in order (names may repeat).
 *
 * Modes:
 *  - send: send every record (paced at harness.rate), flush, close. While sending, a line
 *    {"progress": {...}} every second. Then one line {"results": [...], ...}: per record, in
 *    order, the partition, offset and timestamp Kafka (or the agent) acknowledged, or the error
 *    ("exception class: message") the callback or send() reported.
 *  - init-transactions: create the producer and call initTransactions(); one line with the
 *    exception it raised (class, message, causes), or none.
 */
public final class JavaProducer {
    private static final String HARNESS = "harness.";
    private static final String NULL = "-";

    private JavaProducer() {}

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: JavaProducer send|init-transactions SETTINGS_FILE [RECORDS_FILE]");
            System.exit(2);
        }
        Properties all = new Properties();
        try (FileInputStream in = new FileInputStream(args[1])) {
            all.load(in);
        }
        Properties settings = new Properties();
        Properties harness = new Properties();
        for (String name : all.stringPropertyNames()) {
            if (name.startsWith(HARNESS)) {
                harness.setProperty(name.substring(HARNESS.length()), all.getProperty(name));
            } else {
                settings.setProperty(name, all.getProperty(name));
            }
        }
        switch (args[0]) {
            case "send" -> send(settings, harness, readRecords(Path.of(args[2])));
            case "init-transactions" -> initTransactions(settings);
            default -> {
                System.err.println("unknown mode " + args[0]);
                System.exit(2);
            }
        }
    }

    private static KafkaProducer<byte[], byte[]> producer(Properties settings) {
        return new KafkaProducer<>(settings, new ByteArraySerializer(), new ByteArraySerializer());
    }

    // ------------------------------------------------------------------ send
    private static void send(Properties settings, Properties harness, List<ProducerRecord<byte[], byte[]>> records)
            throws InterruptedException {
        double rate = Double.parseDouble(harness.getProperty("rate", "0"));
        long closeTimeoutMs = Long.parseLong(harness.getProperty("close.timeout.ms", "600000"));
        int count = records.size();
        AtomicReferenceArray<String> outcomes = new AtomicReferenceArray<>(count);
        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        long started = System.nanoTime();
        long lastProgress = started;
        int sent = 0;
        try (KafkaProducer<byte[], byte[]> producer = producer(settings)) {
            for (int index = 0; index < count; index++) {
                if (rate > 0) {
                    long due = started + (long) (index / rate * 1e9);
                    long wait = due - System.nanoTime();
                    if (wait > 0) {
                        Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                    }
                }
                final int position = index;
                try {
                    producer.send(records.get(index), (RecordMetadata metadata, Exception error) -> {
                        if (error == null) {
                            outcomes.set(position, String.format(
                                    "{\"partition\": %d, \"offset\": %d, \"timestamp\": %d, \"error\": null}",
                                    metadata.partition(), metadata.offset(), metadata.timestamp()));
                            acked.incrementAndGet();
                        } else {
                            outcomes.set(position, "{\"error\": " + quote(describe(error)) + "}");
                            failed.incrementAndGet();
                        }
                    });
                } catch (RuntimeException error) {
                    outcomes.set(position, "{\"error\": " + quote(describe(error)) + "}");
                    failed.incrementAndGet();
                }
                sent++;
                long now = System.nanoTime();
                if (now - lastProgress >= 1_000_000_000L) {
                    lastProgress = now;
                    progress(sent, acked.get(), failed.get(), now - started);
                }
            }
            Thread progressLines = new Thread(() -> {
                try {
                    while (true) {
                        Thread.sleep(1000);
                        progress(count, acked.get(), failed.get(), System.nanoTime() - started);
                    }
                } catch (InterruptedException stop) {
                    // flush and close returned
                }
            });
            progressLines.setDaemon(true);
            progressLines.start();
            producer.flush();
            producer.close(java.time.Duration.ofMillis(closeTimeoutMs));
            progressLines.interrupt();
        }
        StringBuilder out = new StringBuilder("{\"results\": [");
        for (int index = 0; index < count; index++) {
            out.append(index == 0 ? "" : ", ");
            String outcome = outcomes.get(index);
            out.append(outcome == null ? "{\"error\": \"no callback\"}" : outcome);
        }
        out.append(String.format("], \"seconds\": %.3f}", (System.nanoTime() - started) / 1e9));
        emit(out.toString());
    }

    private static void progress(int sent, int acked, int failed, long elapsedNanos) {
        emit(String.format("{\"progress\": {\"sent\": %d, \"acked\": %d, \"failed\": %d, \"seconds\": %.3f}}",
                sent, acked, failed, elapsedNanos / 1e9));
    }

    // ------------------------------------------------------------------ transactions
    private static void initTransactions(Properties settings) {
        String exception = "null";
        try (KafkaProducer<byte[], byte[]> producer = producer(settings)) {
            producer.initTransactions();
        } catch (RuntimeException error) {
            StringBuilder causes = new StringBuilder("[");
            for (Throwable cause = error.getCause(); cause != null; cause = cause.getCause()) {
                causes.append(causes.length() > 1 ? ", " : "").append(quote(describe(cause)));
            }
            exception = String.format("{\"class\": %s, \"message\": %s, \"causes\": %s]}",
                    quote(error.getClass().getName()), quote(String.valueOf(error.getMessage())), causes);
        }
        emit("{\"exception\": " + exception + "}");
    }

    // ------------------------------------------------------------------ input and output
    private static List<ProducerRecord<byte[], byte[]>> readRecords(Path file) throws IOException {
        List<ProducerRecord<byte[], byte[]>> records = new ArrayList<>();
        try (BufferedReader reader = Files.newBufferedReader(file, StandardCharsets.UTF_8)) {
            String line;
            while ((line = reader.readLine()) != null) {
                String[] fields = line.split("\t", -1);
                if (fields.length != 6) {
                    throw new IllegalArgumentException("a record line needs 6 fields: " + line);
                }
                Integer partition = fields[1].equals(NULL) ? null : Integer.valueOf(fields[1]);
                Long timestamp = fields[2].equals(NULL) ? null : Long.valueOf(fields[2]);
                List<Header> headers = new ArrayList<>();
                if (!fields[5].isEmpty()) {
                    for (String pair : fields[5].split(",", -1)) {
                        int colon = pair.indexOf(':');
                        String name = new String(bytes(pair.substring(0, colon)), StandardCharsets.UTF_8);
                        headers.add(new RecordHeader(name, bytes(pair.substring(colon + 1))));
                    }
                }
                records.add(new ProducerRecord<>(
                        fields[0], partition, timestamp, bytes(fields[3]), bytes(fields[4]), headers));
            }
        }
        return records;
    }

    private static byte[] bytes(String field) {
        return field.equals(NULL) ? null : Base64.getDecoder().decode(field);
    }

    private static String describe(Throwable error) {
        return error.getClass().getName() + ": " + error.getMessage();
    }

    private static String quote(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        return out.append('"').toString();
    }

    private static synchronized void emit(String line) {
        PrintStream out = System.out;
        out.println(line);
        out.flush();
    }
}
