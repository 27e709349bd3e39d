"""Record formats behind a schema registry: the formats a spec names and their framing
(``wire``), the column types (``types``), the registry (``registry``), Avro's schemas and resolution rules (``avro``,
``avro_resolution``), Protobuf's writer schemas and decoding (``protobuf_schemas``,
``protobuf``). No Spark here: ``protobuf`` runs in Spark's Python workers, imported by name.
"""
