"""Bytes in and out of the service: request bodies, large batches received into their
buffers, files handed over by descriptor, downloads, and promotion on read."""
