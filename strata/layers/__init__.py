"""Building blocks of the forward pass; each picks its implementation when it is built."""
