"""Dataset operations, one per module (Grain's `transformations/` layout).

Each module holds a public dataset class and, for streams, a private
iterator. `MapDataset`/`IterDataset` methods import these modules lazily.
"""
