"""Sources that can only be read front to back: `IterDataset`s over files.

Grain's `ParquetIterDataset` and `TFRecordIterDataset`. They have no random
access, so `mp_prefetch` cannot split them over workers; convert such data to
ArrayRecord (`arrayrecord-convert`) for global shuffling and parallel reads.
"""
