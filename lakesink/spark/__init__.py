"""PySpark glue: the Kafka streaming source, the committing sink, the table reader, sessions."""
