"""One constant per use of randomness in the data, mixed into the seed, so no two draws share a stream and
adding a new use never shifts an existing one."""
GLOBAL_SPLIT = 1
PARTITION = 2
CLIENT_SPLIT = 3
SYNTHETIC = 4
MNIST1D = 5
# A device's own data: the share it holds out where the data names no held-out split of its own.
HELD_OUT = 6
