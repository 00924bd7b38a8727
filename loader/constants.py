"""Grain's metadata key names (`grain.constants`), with the same values.

Grain's legacy `DataLoader` uses these keys for the metadata it attaches to
records; they are here so code that imports them keeps working.
"""

INDEX = "_index"
RECORD_KEY = "_record_key"
DATASET_INDEX = "_dataset_index"
EPOCH = "_epoch"
SEED = "_seed"
RECORD = "_record"

META_FEATURES = frozenset([INDEX, RECORD_KEY, DATASET_INDEX, EPOCH, SEED, RECORD])
