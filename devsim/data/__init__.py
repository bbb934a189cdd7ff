"""Datasets (CIFAR-10/100 readers, real digits from scikit-learn, a synthetic image set) and per-device partitioning."""

from devsim.data.cifar import CIFAR_SPECS, download_cifar, load_cifar
from devsim.data.datasets import DatasetUnavailableError, ImageDataset
from devsim.data.loading import DATASET_NAMES, load_config_split, load_dataset
from devsim.data.partition import (
    PARTITION_KINDS,
    DirichletPartitioner,
    IIDPartitioner,
    NaturalPartitioner,
    Partitioner,
    make_partitioner,
)
from devsim.data.synthetic import make_synthetic, write_cifar_format

__all__ = [
    "CIFAR_SPECS",
    "DATASET_NAMES",
    "PARTITION_KINDS",
    "DatasetUnavailableError",
    "DirichletPartitioner",
    "IIDPartitioner",
    "NaturalPartitioner",
    "ImageDataset",
    "Partitioner",
    "download_cifar",
    "load_cifar",
    "load_config_split",
    "load_dataset",
    "make_partitioner",
    "make_synthetic",
    "write_cifar_format",
]
