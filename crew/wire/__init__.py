"""The wire: frame format, control protocol, data transport and link probes."""
