//! One copy of a volume's data: a chain of sparse-file layers on a node's disk.
