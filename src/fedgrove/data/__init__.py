"""Data layer: file loaders, named datasets, partition simulators."""

from fedgrove.data.io import Table, load_table, write_table
from fedgrove.data.datasets import Dataset, available_datasets, data_dir, load_dataset
from fedgrove.data.partition import (Partition, PartyShard, horizontal_partition, hybrid_partition,
                                     join_partition, read_partition, vertical_partition, write_partition)

__all__ = [
    "Table", "load_table", "write_table", "Dataset", "available_datasets", "data_dir", "load_dataset",
    "Partition", "PartyShard", "horizontal_partition", "vertical_partition", "hybrid_partition",
    "write_partition", "read_partition", "join_partition",
]
