"""Re-exports: decoding in image_decode, folder scan in image_scan, data sets in image_datasets, CIFAR-10 in cifar."""

from .cifar import CIFAR10, CIFAR10_CLASSES, CifarBatchError, load_cifar_batch
from .image_sets import ImageFolder, ImageTensorDataset, load_digits_dataset
from .image_decode import decode_image, decode_images, decompression_bomb_sizes
from .image_extensions import IMG_EXTENSIONS
from .image_scan import scan_images

__all__ = [
    "IMG_EXTENSIONS",
    "CIFAR10_CLASSES",
    "ImageTensorDataset",
    "ImageFolder",
    "CIFAR10",
    "decode_images",
    "decode_image",
    "scan_images",
    "load_digits_dataset",
    "load_cifar_batch",
    "CifarBatchError",
    "decompression_bomb_sizes",
]
