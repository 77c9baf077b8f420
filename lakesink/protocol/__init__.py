"""Pure protocol logic: offsets, instants, write statuses, the commit decision, conflict rules.

Standard library only; no Spark, Kafka or I/O. Every other layer depends on this one.
"""
