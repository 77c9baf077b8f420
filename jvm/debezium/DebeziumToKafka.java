// Debezium's embedded engine feeding Apache Kafka, for lakesink's change-data-capture tests.
//
// Run from source (Java 11+ compiles a single-file program at launch; nothing is built ahead):
//   java -cp "$LAKESINK_CACHE/debezium/lib/*" jvm/debezium/DebeziumToKafka.java \
//        producer.properties connector-a.properties [connector-b.properties ...]
//
// One engine per connector properties file (Debezium's own keys: name, connector.class,
// database.*, topic.prefix, offset.storage.file.filename, key/value.converter.schemas.enable...),
// one Kafka producer (producer.properties: bootstrap.servers and producer settings) shared by
// them. Each change event is the JSON converter's bytes for key and value, sent to the topic the
// connector names (`<topic.prefix>.<schema>.<table>`), tombstones included (a null value). A
// batch's offsets are marked processed only after Kafka acknowledged every record of it, so a
// crash sends changes again rather than losing them (at least once, as Kafka Connect does).
//
// Stopping: SIGTERM closes the engines (their offsets are flushed) and then the producer. An
// engine that stops with an error prints ENGINE_FAILED and the process exits with status 1.

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.JsonByteArray;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class DebeziumToKafka {
    static final String ENGINE_FAILED = "Debezium engine stopped with an error";

    private DebeziumToKafka() {}

    static Properties load(String file) throws IOException {
        Properties properties = new Properties();
        try (InputStream in = Files.newInputStream(Path.of(file))) {
            properties.load(in);
        }
        return properties;
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println(
                    "usage: DebeziumToKafka producer.properties connector.properties...");
            System.exit(2);
        }
        Properties producerProperties = load(args[0]);
        // every record acknowledged by all in-sync replicas before its offset counts as processed
        producerProperties.putIfAbsent(ProducerConfig.ACKS_CONFIG, "all");
        producerProperties.putIfAbsent(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(
                producerProperties, new ByteArraySerializer(), new ByteArraySerializer());

        List<DebeziumEngine<ChangeEvent<byte[], byte[]>>> engines = new ArrayList<>();
        for (int i = 1; i < args.length; i++) {
            Properties connector = load(args[i]);
            String name = connector.getProperty("name", args[i]);
            engines.add(DebeziumEngine.create(JsonByteArray.class)
                    .using(connector)
                    .notifying((records, committer) -> {
                        List<Future<RecordMetadata>> sent = new ArrayList<>(records.size());
                        for (ChangeEvent<byte[], byte[]> event : records) {
                            sent.add(producer.send(new ProducerRecord<>(
                                    event.destination(), event.key(), event.value())));
                        }
                        try {
                            for (Future<RecordMetadata> ack : sent) {
                                ack.get();
                            }
                        } catch (Exception e) {
                            // unacknowledged: stop without marking the batch, so it is sent again
                            throw new InterruptedException("Kafka did not acknowledge: " + e);
                        }
                        for (ChangeEvent<byte[], byte[]> event : records) {
                            committer.markProcessed(event);
                        }
                        committer.markBatchFinished();
                    })
                    .using((success, message, error) -> {
                        if (!success) {
                            System.out.println(ENGINE_FAILED + " (" + name + "): " + message);
                            if (error != null) {
                                error.printStackTrace(System.out);
                            }
                            System.out.flush();
                            Runtime.getRuntime().halt(1);
                        }
                    })
                    .build());
        }

        ExecutorService executor = Executors.newFixedThreadPool(engines.size());
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            for (DebeziumEngine<ChangeEvent<byte[], byte[]>> engine : engines) {
                try {
                    engine.close();
                } catch (IOException e) {
                    System.out.println("closing an engine: " + e);
                }
            }
            executor.shutdown();
            try {
                executor.awaitTermination(30, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            producer.close();
        }, "debezium-to-kafka-shutdown"));
        for (DebeziumEngine<ChangeEvent<byte[], byte[]>> engine : engines) {
            executor.execute(engine);
        }
    }
}
