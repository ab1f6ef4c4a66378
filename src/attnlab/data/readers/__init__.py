"""Reading files safely: images, tables, parallel files, strict text lines, and the shipped corpora
(CIFAR-10, MR, Multi30k, VADER); used by the sources, never imported by a task."""
